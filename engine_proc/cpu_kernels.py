"""Rill's C++ CPU kernels (engine_proc/csrc/*.cpp): built at first use for this CPU, loaded with ctypes.

Each source is compiled with the system's C++ compiler (`-O3 -march=native`, a second or two;
Inductor needs the same compiler) into Rill's cache folder, one file per source, flags, compiler
and CPU, so a restart loads it and another CPU builds its own. The kernels are plain C ABI with
no torch headers. They link libgomp.so.1, which resolves to the copy torch has loaded: they share
torch's OpenMP thread pool and its thread count.

No compiler, a failed build or `RILL_CPU_KERNELS=0`: `load` returns None, a warning says what was
lost, and the callers take their torch paths, which compute the same within rounding.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("rill.model")

CSRC = Path(__file__).parent / "csrc"
# Reassociation lets the compiler vectorise the dot products and sums; no -ffast-math, whose
# start-up code would set flush-to-zero for the whole process.
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math",
            "-fno-signed-zeros", "-shared", "-fPIC"]


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


def _library_path(name: str, compiler: str) -> Path:
    from engine_proc.bundled_model import default_cache_dir
    from engine_proc.cpu_features import cpu_info

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    info = cpu_info()
    key = hashlib.sha256("\n".join([(CSRC / f"{name}.cpp").read_text(), " ".join(CXXFLAGS), version, info.model,
                                    " ".join(sorted(info.flags))]).encode()).hexdigest()[:16]
    return default_cache_dir() / "kernels" / f"{name}-{key}.so"


def _build(name: str, compiler: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = Path(tmp) / path.name
        subprocess.run([compiler, *CXXFLAGS, str(CSRC / f"{name}.cpp"), "-o", str(out)], check=True,
                       capture_output=True, text=True, timeout=300)
        os.replace(out, path)  # atomic: another engine building the same file sees it whole


@functools.cache
def load(name: str, purpose: str) -> ctypes.CDLL | None:
    """csrc/<name>.cpp as a loaded library, built first if needed; None where it cannot be had.
    `purpose` completes the warning: what takes the slower path without it."""
    if os.environ.get("RILL_CPU_KERNELS", "1") == "0":
        return None
    compiler = _compiler()
    if compiler is None:
        log.warning("no C++ compiler found: %s", purpose)
        return None
    try:
        path = _library_path(name, compiler)
        if not path.exists():
            _build(name, compiler, path)
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", None) or e
        log.warning("the CPU kernel %s could not be built (%s): %s", name, str(detail).strip()[-500:], purpose)
        return None
