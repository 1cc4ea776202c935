"""`make bench` (`python -m rill.bench.suite`): the standard suite against servers it starts itself.

1. The serving stack alone: Rill serving a tiny random-weight model against a bare Granian app
   that answers the same SSE shape with no engine (the ceiling of the HTTP layer here), at
   concurrency 1 to 256: streamed tokens/s (64 tokens a request) and requests/s (max_tokens 1).
2. The IPC path: ZeroMQ frames alone against ZeroMQ + shared memory (bench/ipc/ipc_bench.py).
3. The engine step: the native runner against transformers per batch size (bench/kernels/engine_step.py).

Everything lands in bench/results/ (JSON, markdown, plots) and SUMMARY.md holds the headline.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from rill.bench.__main__ import main as bench_main
from rill.bench.features import prefix_cache
from rill.bench.ipc import ipc_bench
from rill.bench.kernels import engine_step
from rill.bench.peers import run as peers
from rill.bench.serving.servers import baseline_server, rill_server
from rill.bench.serving.tiny_model import write_tiny_model

RESULTS = Path(__file__).resolve().parent / "results"
CONCURRENCY = "1,16,64,256"


def http_stack(out: Path, rounds: int, num_prompts: int, scratch: Path) -> dict[str, Path]:
    tiny = write_tiny_model(scratch / "tiny-llama")
    rill = rill_server("--model", str(tiny), "--load-format", "dummy", "--served-model-name", "tiny",
                       "--max-model-len", "1024", "--max-num-seqs", "256", log_path=scratch / "rill.log")
    base = baseline_server(scratch / "baseline.log")
    reports = {}
    with rill, base:
        for name, output_len in (("http-stream", 64), ("http-requests", 1)):
            argv = ["compare", "--server", f"rill-tiny={rill.base_url}", "--server",
                    f"granian-baseline={base.base_url}", "--baseline", "granian-baseline", "--model", "tiny",
                    "--dataset-name", "random", "--random-input-len", "32", "--random-output-len", str(output_len),
                    "--num-prompts", str(num_prompts), "--max-concurrency", CONCURRENCY, "--rounds", str(rounds),
                    "--disable-tqdm", "--out", str(out / name)]
            if bench_main(argv, prog="python -m rill.bench") != 0:
                raise SystemExit(f"bench compare failed for {name}")
            reports[name] = out / name / "compare.json"
    return reports


def http_headline(reports: dict[str, Path]) -> list[str]:
    stream = json.loads(reports["http-stream"].read_text())
    requests = json.loads(reports["http-requests"].read_text())

    def medians(doc, metric):
        return {(a["label"], a["setting"]): a["median"][metric] for a in doc["aggregate"]}

    tok = medians(stream, "output_throughput")
    req = medians(requests, "request_throughput")
    lines = ["| concurrency | Rill tok/s | baseline tok/s | Rill / baseline | Rill req/s (max_tokens 1) "
             "| baseline req/s | Rill / baseline |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for c in sorted({s for _, s in tok}):
        rt, bt = tok[("rill-tiny", c)], tok[("granian-baseline", c)]
        rr, br = req[("rill-tiny", c)], req[("granian-baseline", c)]
        lines.append(f"| {c} | {rt:,.0f} | {bt:,.0f} | {rt / bt:.2f}x | {rr:,.1f} | {br:,.1f} | {rr / br:.2f}x |")
    return lines


def ipc_headline(report: dict) -> list[str]:
    lines = ["| payload | ZeroMQ alone µs/msg | ZeroMQ + shm µs/msg | shm / ZeroMQ time | shm / ZeroMQ CPU |",
             "|---|---:|---:|---:|---:|"]
    for name, result in report["results"].items():
        zmq_alone, shm = result["variants"]["zmq_list"], result["variants"]["shm_ring"]
        lines.append(f"| {name} | {zmq_alone['us_per_msg']:.0f} | {shm['us_per_msg']:.0f} | "
                     f"{shm['us_per_msg'] / zmq_alone['us_per_msg']:.2f}x | "
                     f"{shm['cpu_us_per_msg'] / zmq_alone['cpu_us_per_msg']:.2f}x |")
    return lines


def engine_headline(report: dict) -> list[str]:
    lines = ["| step | native ms | transformers ms | native / transformers | --batch-invariant ms | invariant / native |",
             "|---|---:|---:|---:|---:|---:|"]
    for case, result in report["results"].items():
        native, hf = result["native"]["ms_per_step"], result["transformers"]["ms_per_step"]
        invariant = result["invariant"]["ms_per_step"]
        lines.append(f"| {case} | {native:.1f} | {hf:.1f} | {native / hf:.2f}x | {invariant:.1f} | "
                     f"{invariant / native:.2f}x |")
    return lines


def targets_headline(peer: dict, prefix: dict) -> list[str]:
    lines = ["| target | measured | goal | verdict |", "|---|---:|---:|---|"]
    for name, result in peer["results"].items():
        lines.append(f"| {name}: {result['what']} | {result['ratio']:.2f}x | {result['target']}x | "
                     f"{'PASS' if result['pass'] else 'FAIL'} |")
    lines.append(f"| TTFT with a shared {prefix['params']['prefix_len']}-token prefix, warm / cold | "
                 f"{prefix['median_ratio']:.2f}x | <= {prefix['target']}x | {'PASS' if prefix['pass'] else 'FAIL'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.suite", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved rounds of the HTTP comparison")
    ap.add_argument("--num-prompts", type=int, default=256)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rill-bench-") as scratch:
        reports = http_stack(args.out, args.rounds, args.num_prompts, Path(scratch))
    ipc = ipc_bench.main(["--out", str(args.out / "ipc_bench-cpu.json")])
    engine = engine_step.main(["--out", str(args.out / "engine_step-float32-cpu.json")])
    peer = peers.main(["--out", str(args.out / "peers-cpu.json")])
    prefix = prefix_cache.main(["--out", str(args.out / "prefix_cache-cpu.json")])
    summary = ["# Rill benchmark suite", "", f"Made by `make bench` (`python -m rill.bench.suite`) on "
               f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs.", "",
               "## The serving stack alone (tiny random-weight model vs a bare Granian SSE app)", "",
               *http_headline(reports), "",
               "Medians over interleaved rounds; details and plots in `http-stream/` and `http-requests/`.", "",
               "## IPC: token ids through ZeroMQ frames alone vs ZeroMQ + shared memory", "",
               *ipc_headline(ipc), "", *ipc["conclusion"], "", "Details: `ipc_bench-cpu.md`.", "",
               "## Engine step: native runner vs transformers (bundled model, float32)", "",
               *engine_headline(engine), "", "Details: `engine_step-float32-cpu.md`.", "",
               "## Issue 4's CPU targets against transformers, and prefix caching", "",
               *targets_headline(peer, prefix), "", "Details: `peers-cpu.md`, `prefix_cache-cpu.md`.", ""]
    (args.out / "SUMMARY.md").write_text("\n".join(summary))
    print("\n".join(summary))
    print(f"suite done in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
