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


def start_quantized(stack: contextlib.ExitStack, flags: list[str], log_path: Path) -> ServerProcess | str:
    """A quantized Rill, or why it is unavailable: a rill serve without that --quantization exits on it."""
    server = rill_server(*flags, log_path=log_path)
    try:
        return stack.enter_context(server)
    except RuntimeError as exc:
        server.stop()
        if "unrecognized arguments" not in str(exc) and "invalid choice" not in str(exc):
            raise
        return next((line.strip() for line in str(exc).splitlines() if "error:" in line), "unknown argument")


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
    where nothing is measured): `transformers serve`, whose start is the longest (17 s of the 38 s quick run
    on a 2-core VM), launched first and waited for last, so that it starts while Rill's servers do."""
    out = Started()
    early = None
    if overlap and "transformers_serve" in peers:
        early = transformers_serve(model_dir, scratch, num_threads)
        stack.push(early.__exit__)
    started_s = time.monotonic()
    out.servers["rill"] = stack.enter_context(rill_server(*flags, log_path=scratch / "rill.log"))
    out.startup_s["rill"] = time.monotonic() - started_s
    for side, side_flags in QUANTIZED_SIDES.items():
        if side in peers:
            started_s = time.monotonic()
            server = start_quantized(stack, [*flags, *side_flags], scratch / f"{side}.log")
            if isinstance(server, str):
                out.unavailable[side] = server
                print(f"{side} unavailable: {server}", flush=True)
            else:
                out.servers[side] = server
                out.startup_s[side] = time.monotonic() - started_s
    if early is not None:
        out.servers["transformers_serve"] = early.wait_ready()
    elif "transformers_serve" in peers:
        out.servers["transformers_serve"] = stack.enter_context(transformers_serve(model_dir, scratch, num_threads))
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
