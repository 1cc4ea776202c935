"""Rill's C++ CPU kernels (kernels/csrc/), built at first use for this CPU, as torch operators.

Each .cpp file of csrc/ is a kernel family and its operators, or bindings.cpp, which registers them
all. They are compiled a group to each core, each group as one translation unit that includes its
files (a unity build: torch's and the standard headers are parsed once a group, not once a file,
which was half of each file's time), with the
system's C++ compiler (`-O3 -march=native`; Inductor needs the same compiler) against the running
torch's headers, then linked into Rill's cache folder: one file per sources, flags, compiler, torch
and CPU, so a restart loads it and another CPU builds its own. Loaded, it registers the operators
`torch.ops.rill_cpu.*`, which a compiled decode step calls without Python in between. The library
links libgomp.so.1, which resolves to the copy torch has loaded: the kernels share torch's OpenMP
thread pool and its thread count.

No compiler, a failed build or `RILL_CPU_KERNELS=0`: `available()` is False, a warning says what
was lost, and the callers take their torch paths, which compute the same within rounding.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from rill.engine_proc.model.cache_lock import cache_lock

log = logging.getLogger("rill.model")

CSRC = Path(__file__).parent / "csrc"
# No reassociation (-ffast-math, -fassociative-math): a row's arithmetic must not depend on how
# the compiler treated the instance it ran in (the reductions vectorise through `omp simd`), and
# -ffast-math's start-up code would set flush-to-zero for the whole process.
CXXFLAGS = ["-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-mprefer-vector-width=512", "-fPIC", "-std=c++20", "-w"]


def sources() -> list[Path]:
    """The kernels' source files: every .cpp file of csrc/ (none includes another)."""
    return sorted(CSRC.glob("*.cpp"))


def unity_groups(files: list[Path], num_groups: int) -> list[list[Path]]:
    """`files` in at most `num_groups` groups of about equal cost, each compiled as one translation unit.
    The cost of a file: its size, and bindings.cpp's (torch/library.h) as much as the largest file's again."""
    def cost(f: Path) -> int:
        return f.stat().st_size + (max(g.stat().st_size for g in files) if f.name == "bindings.cpp" else 0)

    groups: list[list[Path]] = [[] for _ in range(max(1, min(num_groups, len(files))))]
    totals = [0] * len(groups)
    for f in sorted(files, key=cost, reverse=True):  # the largest first, each to the lightest group
        i = totals.index(min(totals))
        groups[i].append(f)
        totals[i] += cost(f)
    return groups


def _target_flags() -> list[str]:
    """-O3 -march=native, or RILL_CPU_ARCH's target (x86-64-v3 for AVX2 without AVX-512, x86-64 for
    SSE2 alone) and RILL_CPU_OPT's level: tests build for older CPUs than the one they run on to check
    those paths, at -O1 (on 2 cores a build in 11 s against 15 s at -O3; those tests run in 3 s)."""
    return [os.environ.get("RILL_CPU_OPT") or "-O3", f"-march={os.environ.get('RILL_CPU_ARCH') or 'native'}"]


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _torch_compile_flags() -> list[str]:
    root = Path(torch.__file__).parent
    return [f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}", f"-I{root / 'include'}"]


def _torch_link_flags() -> list[str]:
    return [f"-L{Path(torch.__file__).parent / 'lib'}", "-ltorch_cpu", "-lc10"]


def _library_path(compiler: str) -> Path:
    from rill.engine_proc.cpu_features import cpu_info
    from rill.engine_proc.model.bundled import default_cache_dir

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    info = cpu_info()
    # Every file of csrc/, headers too: any change of source makes a new build.
    files = sorted(CSRC.glob("*.cpp")) + sorted(CSRC.glob("*.h"))
    key = hashlib.sha256("\n".join([*(f"{f.name}\n{f.read_text()}" for f in files), " ".join(CXXFLAGS + _target_flags()),
                                    version, torch.__version__, info.model, " ".join(sorted(info.flags))]).encode())
    return default_cache_dir() / "kernels" / f"rill_cpu-{key.hexdigest()[:16]}.so"


STALE_AFTER_S = 30 * 86400  # builds not used for this long are pruned when a new one is made


def prune(folder: Path, keep: Path, now: float | None = None) -> list[Path]:
    """Deletes the kernel builds in `folder` other than `keep` that no start has used for
    STALE_AFTER_S (every load touches its file), and the ctypes-era `paged_decode-*.so`: each
    change of source, flags, compiler, torch or CPU makes a new file. Returns what it deleted."""
    now = time.time() if now is None else now
    removed = []
    for f in folder.glob("*.so"):
        try:
            if f != keep and (f.name.startswith("paged_decode-") or now - f.stat().st_mtime > STALE_AFTER_S):
                f.unlink()
                removed.append(f)
        except OSError:  # another engine pruned or loads it: leave it
            pass
    return removed


def _build(compiler: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name

        def compile_one(index_group: tuple[int, list[Path]]) -> str:
            unit = _unity_file(Path(tmp), *index_group)
            obj = str(unit.with_suffix(".o"))
            subprocess.run([compiler, *CXXFLAGS, *_target_flags(), *_torch_compile_flags(), "-c", str(unit), "-o", obj],
                           check=True, capture_output=True, text=True, timeout=600)
            return obj

        cores = len(os.sched_getaffinity(0))
        with ThreadPoolExecutor(max_workers=cores) as pool:
            objects = list(pool.map(compile_one, enumerate(unity_groups(sources(), cores))))
        subprocess.run([compiler, "-shared", "-fopenmp", *objects, "-o", str(out), *_torch_link_flags()], check=True,
                       capture_output=True, text=True, timeout=600)
        os.replace(out, path)  # atomic: another engine building the same file sees it whole


def _unity_file(folder: Path, index: int, group: list[Path]) -> Path:
    unit = folder / f"unity{index}.cpp"
    unit.write_text("".join(f'#include "{f}"\n' for f in group))
    return unit


def syntax_errors(compiler: str, targets: list[list[str]], folder: Path) -> list[str]:
    """The compiler's errors (syntax and types only: nothing is built) for each target's flags (`-march=...`),
    every source in one translation unit: a CPU's paths that this one does not build, and any two files that
    clash (a file-local name defined twice, a macro one leaves behind), which the build's unity groups, set by
    the number of cores, may put together. Tests call it; torch's headers, parsed once a target, are most of
    its time."""
    unit = _unity_file(folder, 0, sources())

    def check(target: list[str]) -> str:
        done = subprocess.run([compiler, *CXXFLAGS, *target, *_torch_compile_flags(), "-fsyntax-only", str(unit)],
                              capture_output=True, text=True, timeout=600)
        return "" if done.returncode == 0 else f"{' '.join(target)}: {done.stderr.strip()[-1500:]}"

    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        return [e for e in pool.map(check, targets) if e]


_loaded = [False]


def loaded() -> bool:
    """Whether available() has loaded the operators: no side effect, so torch.compile traces it."""
    return _loaded[0]


def ensure_built(compiler: str, path: Path) -> None:
    """Builds `path` unless it is there. Processes starting together (test workers, data-parallel engines)
    build it once: the others wait on a lock beside it, then find it."""
    if path.exists():
        return
    lock = path.with_suffix(".lock")
    with cache_lock(lock):
        if path.exists():
            return
        started = time.perf_counter()
        _build(compiler, path)
        prune(path.parent, keep=path)
        lock.unlink()  # a waiter holds it open; a later start finds the build
        log.info("built the CPU kernels for this CPU in %.1f s: %s", time.perf_counter() - started, path)


@functools.cache
def available() -> bool:
    """Whether torch.ops.rill_cpu is loaded, building it first if needed."""
    if os.environ.get("RILL_CPU_KERNELS", "1") == "0":
        return False
    compiler = _compiler()
    if compiler is None:
        log.warning("no C++ compiler found: decode attention and int8 decode linears take slower torch paths")
        return False
    try:
        path = _library_path(compiler)
        ensure_built(compiler, path)
        torch.ops.load_library(str(path))
        with contextlib.suppress(OSError):  # a read-only cache still serves
            os.utime(path)  # in use: not pruned as stale
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or e
        log.warning("the CPU kernels could not be built (%s): decode attention and int8 decode linears take "
                    "slower torch paths", str(detail).strip()[-500:])
        return False
    _register_fakes()
    _loaded[0] = True
    return True


@functools.cache  # once per process: loading the library again (tests) registers nothing new
def _register_fakes() -> None:
    """Shapes for torch.compile's tracing (the operators run only on real tensors)."""
    lib = torch.library

    @lib.register_fake("rill_cpu::paged_decode")
    def _(q, k_cache, v_cache, block_table, context_lens, k_new=None, v_new=None, slot_mapping=None, window=0,
          softcap=0.0, sinks=None):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @lib.register_fake("rill_cpu::paged_decode_layer")
    def _(q, k, v, slot_mapping, block_table, context_lens, layer, window=0, softcap=0.0, sinks=None):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @lib.register_fake("rill_cpu::kv_int8_gather")
    def _(cache, block_table, length, like):
        return like.new_empty(length, cache.shape[2], cache.shape[3] - 4)

    @lib.register_fake("rill_cpu::int8_gemv")
    def _(x, weight_int8, scale, in_features):
        return x.new_empty(x.shape[0], weight_int8.shape[0])

    @lib.register_fake("rill_cpu::rms_norm")
    def _(x, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @lib.register_fake("rill_cpu::add_rms_norm")
    def _(x, residual, weight, eps):
        return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(x, memory_format=torch.contiguous_format)

    @lib.register_fake("rill_cpu::silu_mul")
    def _(gate_up):
        return gate_up.new_empty(gate_up.shape[0], gate_up.shape[1] // 2)

    @lib.register_fake("rill_cpu::soft_cap")
    def _(x, cap):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    @lib.register_fake("rill_cpu::prefill_attention")
    def _(q, k, v):
        return torch.empty_like(q, memory_format=torch.contiguous_format)

    @lib.register_fake("rill_cpu::amx_linear")
    def _(x, packed, bias, out_features, fixed_tiles=False):
        return x.new_empty(x.shape[0], out_features)

    @lib.register_fake("rill_cpu::amx_linear_rope")
    def _(x, packed, bias, out_features, fixed_tiles, cos, sin, rope_cols):
        return x.new_empty(x.shape[0], out_features)

    @lib.register_fake("rill_cpu::amx_linear_silu_mul")
    def _(x, packed, bias, out_features, fixed_tiles=False):
        return x.new_empty(x.shape[0], out_features // 2)

    @lib.register_fake("rill_cpu::int8_linear")
    def _(x, weight_int8, scale, in_features, gemv_max_rows, chunk_elems):
        return x.new_empty(x.shape[0], weight_int8.shape[0])

    @lib.register_fake("rill_cpu::int4_gemv")
    def _(x, packed, scales, offsets, in_features):
        return x.new_empty(x.shape[0], packed.shape[0])

    @lib.register_fake("rill_cpu::int4_linear")
    def _(x, packed, scales, offsets, in_features, gemv_max_rows, chunk_elems):
        return x.new_empty(x.shape[0], packed.shape[0])
