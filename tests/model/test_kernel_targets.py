"""The C++ kernels build on this CPU wherever a compiler is (a failed build only logs a warning and every kernel
test skips, so it is asserted here), and compile for the AVX-512 CPUs this one is not: a Skylake-era AVX-512
without BF16, a Zen 4's AVX-512 BF16 without AMX, and a Xeon's AMX. Their paths are chosen by the preprocessor
(csrc/amx_tiles.h, bf16_simd.h), so a build for one CPU can hide another's error: a Zen 4's build once failed
where the Xeon's passed. The AVX2 and SSE2 builds run their tests (test_cpu_kernels_portable.py)."""
from __future__ import annotations

import pytest

from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.kernels import extension

needs_compiler = pytest.mark.skipif(extension._compiler() is None, reason="no C++ compiler")

AVX512 = ["-march=x86-64-v4"]  # AVX-512 F/BW/DQ/VL: no BF16, no VNNI
ZEN4 = ["-march=znver4"]  # AVX-512 BF16 and VNNI, no AMX
XEON_AMX = ["-march=sapphirerapids"]  # AMX tiles as well


@needs_compiler
def test_kernels_build_on_this_cpu():
    assert extension.available(), "the CPU kernels did not build on this CPU: the engine's log says why"


@needs_compiler
def test_kernels_compile_for_the_other_avx512_cpus(tmp_path):
    """Every source in one unit (no two may clash, whatever the build's unity groups: they depend on the number of
    cores), for each AVX-512 target this CPU is not, and for the Xeon's always: its target has every #if path."""
    native = XEON_AMX if cpu_info().has("amx_bf16") else ZEN4 if cpu_info().has("avx512_bf16") else None
    targets = [t for t in (AVX512, ZEN4) if t is not native] + [XEON_AMX]
    assert extension.syntax_errors(extension._compiler(), targets, tmp_path) == []


@needs_compiler
def test_a_clash_between_two_files_is_found(tmp_path, monkeypatch):
    """The check fails where two files define one file-local name (and so a unity build of the two would)."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    for name in ("a.cpp", "b.cpp"):
        (csrc / name).write_text("static int helper() { return 1; }\n")
    monkeypatch.setattr(extension, "CSRC", csrc)
    (error,) = extension.syntax_errors(extension._compiler(), [AVX512], tmp_path)
    assert "helper" in error
