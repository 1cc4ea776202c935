"""What this CPU does fast, detected once at start: the dtype `--dtype auto` picks and why."""
from __future__ import annotations

import functools
from dataclasses import dataclass

# The flags that decide a fast path, in /proc/cpuinfo's spelling.
REPORTED_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    vendor: str
    flags: frozenset[str]

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def reported_flags(self) -> list[str]:
        return [f for f in REPORTED_FLAGS if f in self.flags]

    def summary(self) -> str:
        return f"{self.model} ({' '.join(self.reported_flags) or 'no AVX2'})"


@functools.cache
def cpu_info(cpuinfo_path: str = "/proc/cpuinfo") -> CpuInfo:
    model, vendor, flags = "unknown", "unknown", frozenset()
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and model == "unknown":
                    model = value
                elif key == "vendor_id" and vendor == "unknown":
                    vendor = value
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
    except OSError:  # not Linux: nothing detected, so the safe choices below
        pass
    return CpuInfo(model, vendor, flags)


def auto_cpu_dtype(info: CpuInfo | None = None) -> tuple[str, str]:
    """(dtype name, why) for `--dtype auto` on the CPU.

    bfloat16 where the CPU multiplies it natively (AMX tiles, or AVX512-BF16 dot products):
    measured on such CPUs a bf16 linear is 2-3.4x a float32 one from 32 rows up, and decode,
    bound by weight reads, reads half the bytes. Without them oneDNN converts bf16 to float32
    on the fly, slower than float32 itself, so float32 stays.
    """
    info = info or cpu_info()
    if info.has("amx_bf16") and info.has("amx_tile"):
        return "bfloat16", "AMX-BF16 tiles multiply bfloat16 natively"
    if info.has("avx512_bf16"):
        return "bfloat16", "AVX512-BF16 multiplies bfloat16 natively"
    return "float32", "no native bfloat16 multiply (no AMX-BF16 or AVX512-BF16)"


def machine_record() -> dict:
    """The CPU as every benchmark result records it."""
    info = cpu_info()
    return {"cpu_model": info.model, "cpu_vendor": info.vendor, "cpu_flags": info.reported_flags}
