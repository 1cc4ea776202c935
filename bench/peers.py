"""Rill against transformers on the engine's CPU targets (throughput, ITL, TTFT), measured in one run.

    python -m bench.peers [--quick] [--rounds 2] [--out bench/results/peers-cpu.json]

1. Throughput (target Rill >= 3x): 32 prompts of exactly 128 tokens (our `random` dataset and the
   bundled tokenizer), 128 forced output tokens each. Rill: `rill serve` on the bundled model
   (float32, --max-num-seqs 32) driven by our harness at concurrency 32 with ignore_eos; its
   aggregate output tokens/s. transformers: the same token ids in ONE `generate` call (left
   padding, greedy, min_new_tokens = max_new_tokens = 128, float32); 32 * 128 / wall time.
2. Latency at concurrency 1 (target Rill <= 0.8x): Rill's median inter-token latency over a few
   128-in/128-out requests sent one at a time, against one transformers decode step at batch 1
   whose DynamicCache holds the context Rill's requests hold half-way (128 + 64 = 192 tokens),
   median over steps. Rill's figure includes HTTP, IPC, detokenization and SSE; transformers'
   is the bare forward and argmax.
3. TTFT (target Rill <= 1.2x): 512-token prompts through Rill with max_tokens 1, one at a time
   (median), against transformers' forward over the same token ids with logits_to_keep=1 (median).
4. Served throughput (target Rill >= 4x): the prompts of 1. through `transformers serve
   --continuous-batching` (float32, CPU) driven by the same harness at concurrency 32, greedy, every
   request run to 128 tokens (see bench/tf_serve.py for how), against Rill's figure from 1.

No two sides compute at once: each round runs Rill's three measurements, transformers' and
transformers serve's one after another (who goes first rotates by round); between them the idle
servers wait on their sockets. Each round draws fresh prompts (another seed), the same for both, so a
prefix cache could never serve a later round. Both sides run the same number of torch threads:
torch's default in this process (one per core), passed to the server as --num-threads.
Rill's side includes the harness's own CPU use on the same machine, as any served benchmark does.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.datasets import load_tokenizer
from bench.hf_generate import decode_steps_ms, generate_throughput, load_model, prefill_ms
from bench.markdown import number, table
from bench.provenance import provenance, save_results
from bench.serve import BenchConfig, build_prompts
from bench.servers import rill_server
from bench.tf_serve import run_forced, serve_throughput, transformers_serve
from engine_proc.bundled_model import ensure_bundled_model

DEFAULT_OUT = Path("bench/results/peers-cpu.json")
MAX_MODEL_LEN = 1024
# (comparison, target): Rill / transformers must be >= or <= the target.
TARGETS = {"throughput": (">=", 3.0), "itl": ("<=", 0.8), "ttft": ("<=", 1.2), "serve_throughput": (">=", 4.0)}
SIDES = ("rill", "transformers", "transformers_serve")


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


def _run(base_url: str, prompts: list, concurrency: int) -> dict:
    return run_forced(base_url, prompts, concurrency, "Rill")


def rill_phase(base_url: str, work: Workload) -> dict:
    start_s = time.perf_counter()
    tp = _run(base_url, work.throughput, len(work.throughput))
    itl = _run(base_url, work.itl, 1)
    ttft = _run(base_url, work.ttft, 1)
    return {"output_throughput": tp["output_throughput"], "duration_s": tp["duration"],
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


def warm_up(base_url: str, serve_url: str, model_id: str, model, sizes: Sizes) -> None:
    """Untimed: first requests through both servers, and a first generate (lazy init, allocator)."""
    work = build_workload(dataclasses.replace(sizes, num_prompts=2, output_len=4, num_itl_requests=1,
                                              num_ttft_requests=1), round_index=99)
    rill_phase(base_url, work)
    serve_throughput(serve_url, model_id, work.throughput)
    generate_throughput(model, work.throughput_ids, 4)


def verdict(name: str, ratio: float) -> bool:
    op, target = TARGETS[name]
    return ratio >= target if op == ">=" else ratio <= target


def summarize(rounds: list[dict]) -> dict:
    med = statistics.median
    rill, hf = [r["rill"] for r in rounds], [r["transformers"] for r in rounds]
    served = [r["transformers_serve"] for r in rounds]
    pairs = {
        "throughput": (med([r["output_throughput"] for r in rill]), med([h["output_throughput"] for h in hf]),
                       "output tok/s", "aggregate output tokens/s, median over rounds"),
        "itl": (med([x for r in rill for x in r["itls_ms"]]), med([x for h in hf for x in h["decode_steps_ms"]]),
                "ms", "Rill median ITL at concurrency 1 / one transformers decode step at batch 1"),
        "ttft": (med([x for r in rill for x in r["ttfts_ms"]]), med([x for h in hf for x in h["prefills_ms"]]),
                 "ms", "Rill median TTFT / transformers prefill forward of the same prompt"),
        "serve_throughput": (med([r["output_throughput"] for r in rill]),
                             med([s["output_throughput"] for s in served]), "output tok/s",
                             "aggregate output tokens/s at c=32 / transformers serve --continuous-batching"),
    }
    out = {}
    for name, (rill_value, hf_value, unit, what) in pairs.items():
        ratio = rill_value / hf_value
        op, target = TARGETS[name]
        out[name] = {"rill": rill_value, "transformers": hf_value, "unit": unit, "what": what, "ratio": ratio,
                     "target": f"{op} {target:g}", "pass": verdict(name, ratio)}
    out["throughput"]["ratio_per_round"] = [r["output_throughput"] / h["output_throughput"] for r, h in zip(rill, hf)]
    out["serve_throughput"]["ratio_per_round"] = [r["output_throughput"] / s["output_throughput"]
                                                  for r, s in zip(rill, served)]
    return out


def markdown(report: dict) -> str:
    p, m, res = report["params"], report["machine"], report["results"]
    rows = [[name, res[name]["what"], f"{number(res[name]['rill'])} {res[name]['unit']}",
             f"{number(res[name]['transformers'])} {res[name]['unit']}", f"{res[name]['ratio']:.2f}x",
             res[name]["target"] + "x", "PASS" if res[name]["pass"] else "FAIL"] for name in TARGETS]
    med = statistics.median
    raw = [[r["round"] + 1, r["first"], number(r["rill"]["output_throughput"]),
            number(r["transformers"]["output_throughput"]), number(r["transformers_serve"]["output_throughput"]),
            number(r["rill"]["median_itl_ms_this_round"]),
            number(med(r["transformers"]["decode_steps_ms"])), number(med(r["rill"]["ttfts_ms"])),
            number(med(r["transformers"]["prefills_ms"]))] for r in report["rounds"]]
    s = p["sizes"]
    out = [f"# Rill vs transformers: the CPU targets ({m['name']})", "",
           f"- command: `{report['command']}`", f"- date: {report['date']}",
           f"- machine: {m['cpu_count']} CPUs ({m['cpus_usable']} usable), {m['cpu_model']}, torch {m['torch']}, "
           f"transformers {m['transformers']}; load {m['load_avg_1m_start']:.2f} at start, "
           f"{m['load_avg_1m_end']:.2f} at end",
           f"- model: {p['model']} (float32); torch threads {p['torch_threads']} on both sides "
           f"(transformers in-process at torch's default, `rill serve --num-threads {p['torch_threads']}`); "
           f"transformers attention `{p['hf_attn_implementation']}`",
           f"- rill serve flags: `{' '.join(p['rill_flags'])}`",
           f"- workload: {s['num_prompts']} prompts x {s['input_len']} tokens -> {s['output_len']} tokens; "
           f"ITL over {s['num_itl_requests']} requests/round, decode context {p['decode_context_len']}; "
           f"TTFT {s['num_ttft_requests']} prompts x {s['ttft_input_len']} tokens/round",
           f"- {p['rounds']} interleaved rounds{' (--quick: tiny sizes, not a measurement)' if p['quick'] else ''}; "
           f"run took {report['wall_s']:.0f} s", "",
           table(["target", "what", "Rill", "transformers", "Rill / transformers", "target", "verdict"], rows),
           "## Per round", "",
           table(["round", "first", "Rill tok/s", "transformers tok/s", "transformers serve tok/s", "Rill median ITL ms",
                  "transformers decode ms", "Rill median TTFT ms", "transformers prefill ms"], raw),
           "## How it is measured", "", *__doc__.splitlines()[4:]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes and 1 round: checks that it runs")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2, quick 1)")
    ap.add_argument("--num-threads", type=int, default=None,
                    help="torch threads on both sides (default: torch's default here, one per core)")
    ap.add_argument("--machine", default=None, help="machine name recorded in the results (default: hostname)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the .json path (a .md goes beside it)")
    args = ap.parse_args(argv)
    started_s = time.perf_counter()
    sizes = QUICK if args.quick else Sizes()
    num_rounds = args.rounds or (1 if args.quick else 2)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    num_threads = torch.get_num_threads()
    need_len = max(sizes.input_len + sizes.output_len, sizes.ttft_input_len + 1)
    assert need_len <= MAX_MODEL_LEN, f"requests of {need_len} tokens exceed --max-model-len {MAX_MODEL_LEN}"
    report = {"benchmark": "peers", **provenance("bench.peers", argv, args.machine)}
    model_dir = ensure_bundled_model()
    model = load_model(model_dir, torch.float32)
    flags = ["--model", str(model_dir), "--dtype", "float32", "--max-num-seqs", str(max(32, sizes.num_prompts)),
             "--max-model-len", str(MAX_MODEL_LEN), "--num-threads", str(num_threads)]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="rill-peers-") as scratch:
        with rill_server(*flags, log_path=Path(scratch) / "rill.log") as server, \
                transformers_serve(model_dir, Path(scratch), num_threads) as peer:
            warm_up(server.base_url, peer.base_url, str(model_dir), model, sizes)
            for r in range(num_rounds):
                work = build_workload(sizes, r)
                order = [SIDES[(r + i) % len(SIDES)] for i in range(len(SIDES))]
                phases = {"rill": lambda: rill_phase(server.base_url, work),
                          "transformers": lambda: hf_phase(model, work, sizes),
                          "transformers_serve": lambda: serve_throughput(peer.base_url, str(model_dir), work.throughput)}
                row = {"round": r, "first": order[0]}
                for side in order:
                    row[side] = phases[side]()
                served = row["rill"]["server_input_tokens"]
                if served is not None and served != row["transformers"]["input_tokens"]:
                    raise RuntimeError(f"Rill counted {served} prompt tokens, transformers got "
                                       f"{row['transformers']['input_tokens']}: not the same prompts")
                rounds.append(row)
                print(f"round {r + 1}/{num_rounds}: Rill {row['rill']['output_throughput']:.0f} tok/s, "
                      f"transformers {row['transformers']['output_throughput']:.0f} tok/s, transformers serve "
                      f"{row['transformers_serve']['output_throughput']:.0f} tok/s", flush=True)
    report["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    report["params"] = {"model": str(model_dir), "dtype": "float32", "quick": args.quick, "rounds": num_rounds,
                        "sizes": dataclasses.asdict(sizes), "decode_context_len": sizes.decode_context_len,
                        "torch_threads": num_threads, "rill_flags": flags,
                        "hf_attn_implementation": model.config._attn_implementation}
    report["results"] = summarize(rounds)
    report["rounds"] = rounds
    report["wall_s"] = time.perf_counter() - started_s
    save_results(args.out, report, markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
