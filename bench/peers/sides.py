"""bench/peers' sides and their servers, started once for a run: Rill (and its quantized twins), vLLM CPU,
llama.cpp's llama-server and transformers serve, each at its defaults."""
from __future__ import annotations

import argparse
import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from rill.bench.peers import llama_cpp, vllm_cpu
from rill.bench.peers.tf_serve import transformers_serve
from rill.bench.serving.servers import ServerExited, ServerProcess, rill_server

SIDES = ("rill", "rill_int8", "rill_int4", "vllm", "llamacpp", "transformers", "transformers_serve")
SERVED_SIDES = ("rill", "rill_int8", "rill_int4", "vllm", "llamacpp")  # measured three ways through our harness
# Rill int4 symmetric, as the Q4_0 file llama.cpp serves (4.5 bits a weight, offset = -8 * scale): the same bytes and
# grid. A GGUF's own 4-bit blocks (the bundled model's Q4_1) are kept as they are whatever the flag says.
QUANTIZED_SIDES = {"rill_int8": ("--quantization", "int8"),
                   "rill_int4": ("--quantization", "int4", "--int4-symmetric")}


def parse_sides(text: str) -> list[str]:
    sides = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(sides) - set(SIDES))
    if unknown or "rill" not in sides:
        raise argparse.ArgumentTypeError(f"sides from {','.join(SIDES)}, rill among them (got {text!r})")
    return [s for s in SIDES if s in sides]


@dataclass
class Started:
    servers: dict[str, ServerProcess] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)  # side -> why it could not run
    startup_s: dict[str, float] = field(default_factory=dict)  # side -> launch to ready
    vllm: dict | None = None
    llamacpp: dict | None = None


def unavailable_flag(server: ServerProcess) -> str | None:
    """Waits for a quantized Rill; None once ready, or why it is unavailable: a rill serve without that
    --quantization exits on it. Any other failure to start stops the run."""
    try:
        server.wait_ready()
    except RuntimeError as exc:
        if "unrecognized arguments" not in str(exc) and "invalid choice" not in str(exc):
            raise
        return next((line.strip() for line in str(exc).splitlines() if "error:" in line), "unknown argument")
    return None


def died_of_a_signal(exc: Exception) -> str | None:
    """Why a server that a signal killed at start could not run, or None for any other failure, which stops the
    run (llama.cpp's default AMX kernels died of SIGILL on an Intel Xeon VM: docs/measured.md)."""
    if not isinstance(exc, ServerExited) or exc.returncode >= 0:
        return None
    try:
        name = signal.Signals(-exc.returncode).name
    except ValueError:
        name = f"signal {-exc.returncode}"
    return f"died of {name} at start (its log: the run's scratch folder)"


def start_sides(stack: contextlib.ExitStack, peers: list[str], scratch: Path, *, flags: list[str], model_dir: Path,
                gguf: Path, vllm_flags: list[str], llama_flags: list[str], num_threads: int | None,
                overlap: bool = False) -> Started:
    """Every served side asked for, one after another (each timed from launch to ready). `overlap` (--quick,
    where nothing is measured): Rill's sides and `transformers serve` (the longest start: 17 s of the 38 s quick
    run on a 2-core VM) launched at once, and then waited for."""
    out = Started()
    launched: dict[str, ServerProcess] = {}

    def launch(side: str) -> ServerProcess:  # stopped by the stack however the run ends
        server = launched[side] = (transformers_serve(model_dir, scratch, num_threads) if side == "transformers_serve"
                                   else rill_server(*flags, *QUANTIZED_SIDES.get(side, ()),
                                                    log_path=scratch / f"{side}.log"))
        stack.callback(server.stop)
        return server

    wanted = [side for side in ("rill", *QUANTIZED_SIDES, "transformers_serve") if side == "rill" or side in peers]
    if overlap:
        for side in sorted(wanted, key=lambda side: side != "transformers_serve"):  # the longest start first
            launch(side)
    for side in wanted:
        started_s = time.monotonic()
        server = launched.get(side) or launch(side)
        if side in QUANTIZED_SIDES and (why := unavailable_flag(server)) is not None:
            out.unavailable[side] = why
            print(f"{side} unavailable: {why}", flush=True)
            continue
        out.servers[side] = server.wait_ready()
        if side != "transformers_serve":
            out.startup_s[side] = time.monotonic() - started_s
    if "llamacpp" in peers:
        start_llamacpp(stack, out, gguf, scratch, llama_flags)
    if "vllm" in peers:
        env = {"OMP_NUM_THREADS": str(num_threads)} if num_threads else {}
        vllm = out.servers["vllm"] = stack.enter_context(vllm_cpu.vllm_server(model_dir, scratch, vllm_flags, env=env))
        out.startup_s["vllm"] = vllm.startup_s
        out.vllm = {"version": vllm_cpu.VERSION, "torch": vllm_cpu.TORCH_VERSION, "flags": vllm_flags,
                    "env": {**vllm_cpu.SERVER_ENV, **env}, "startup_s": vllm.startup_s,
                    "dtype": vllm_cpu.logged_dtype(vllm.log_path), "venv": str(vllm_cpu.venv_dir())}
        print(f"vLLM CPU ready after {vllm.startup_s:.0f} s (dtype {out.vllm['dtype']})", flush=True)
    return out


def start_llamacpp(stack: contextlib.ExitStack, out: Started, gguf: Path, scratch: Path, flags: list[str]) -> None:
    """llama-server into `out`, or why it is unavailable where it died of a signal at start (died_of_a_signal)."""
    server = llama_cpp.llama_server(gguf, scratch, flags)
    try:
        llama = stack.enter_context(server)
    except ServerExited as exc:
        server.stop()
        if (why := died_of_a_signal(exc)) is None:
            raise
        out.unavailable["llamacpp"] = f"llama-server {why}"
        print(f"llamacpp unavailable: {out.unavailable['llamacpp']}", flush=True)
        return
    out.servers["llamacpp"] = llama
    out.startup_s["llamacpp"] = llama.startup_s
    out.llamacpp = {"package": f"{llama_cpp.PACKAGE}=={llama_cpp.VERSION}", "flags": flags, "gguf": gguf.name,
                    "startup_s": llama.startup_s, "build_note": llama_cpp.build_note()}
    print(f"llama.cpp ready after {llama.startup_s:.0f} s", flush=True)
