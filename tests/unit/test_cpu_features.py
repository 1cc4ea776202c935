"""cpu_features: the CPU read from /proc/cpuinfo, and the dtype `--dtype auto` picks from its flags."""
from __future__ import annotations

import pytest

from rill.engine_proc.cpu_features import CpuInfo, auto_cpu_dtype, cpu_info

CPUINFO = """processor\t: 0
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: {flags}

processor\t: 1
vendor_id\t: {vendor}
model name\t: {model}
flags\t\t: {flags}
"""


def write_cpuinfo(tmp_path, vendor: str, model: str, flags: str) -> str:
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO.format(vendor=vendor, model=model, flags=flags))
    return str(path)


@pytest.mark.parametrize("flags, dtype", [
    ("fpu sse avx avx2 fma avx512f avx512_bf16 amx_bf16 amx_tile amx_int8", "bfloat16"),  # Sapphire Rapids
    ("fpu sse avx avx2 fma avx512f avx512_vnni avx512_bf16", "bfloat16"),  # Zen 4
    ("fpu sse avx avx2 fma avx512f avx512_vnni", "float32"),  # Ice Lake: AVX-512 without bf16
    ("fpu sse avx avx2 fma", "float32"),  # Zen 2 / Haswell
    ("fpu sse amx_tile", "float32"),  # tiles without their bf16 instructions
])
def test_auto_dtype_follows_the_flags(tmp_path, flags, dtype):
    cpu_info.cache_clear()
    try:
        info = cpu_info(write_cpuinfo(tmp_path, "GenuineIntel", "Some Xeon", flags))
    finally:
        cpu_info.cache_clear()
    chosen, why = auto_cpu_dtype(info)
    assert chosen == dtype and why
    assert info.model == "Some Xeon" and info.vendor == "GenuineIntel"
    assert info.summary().startswith("Some Xeon (")


def test_no_cpuinfo_is_float32(tmp_path):
    info = CpuInfo("unknown", "unknown", frozenset())
    assert auto_cpu_dtype(info)[0] == "float32"
    assert cpu_info.__wrapped__(str(tmp_path / "missing")) == info


def test_this_machine_is_read():
    info = cpu_info()
    assert info.model != "unknown" and info.flags  # Linux x86-64: /proc/cpuinfo has both
    assert set(info.reported_flags) <= info.flags
