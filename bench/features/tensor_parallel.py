"""`python -m rill.bench.features.tensor_parallel`: `rill serve --tensor-parallel-size 2` against `rill serve` (one rank),
each otherwise with its defaults, the bundled model, the same requests.

1. Latency at concurrency 1: the median inter-token gap of 128 forced tokens, and the TTFT of a
   512-token prompt (median of 5).
2. Throughput: concurrency 32, 64 requests of 128 random tokens in and 64 forced tokens out
   (bench/features/data_parallel.py's workload).

Records the CPU: on a 2-core machine the two ranks get one core each where one rank gets both, so
this measures what the split costs (two all-reduces per layer, the step broadcast), not what a
second machine's cores or memory would add.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from rill.bench.features.data_parallel import MODEL, drive, throughput_bodies
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server


def stream_times(base_url: str, body: dict) -> list[float]:
    """perf_counter() at the request and at each streamed token."""
    times = [time.perf_counter()]
    with httpx.stream("POST", f"{base_url}/v1/completions", timeout=600,
                      json={"model": MODEL, "temperature": 0, "stream": True, "ignore_eos": True, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
    return times


def latency(base_url: str) -> dict:
    gen = random.Random(3)
    times = stream_times(base_url, {"prompt": [gen.randrange(1000, 40000) for _ in range(16)], "max_tokens": 128})
    gaps = [b - a for a, b in zip(times[1:], times[2:])]
    ttfts = []
    for _ in range(5):
        prompt = [gen.randrange(1000, 40000) for _ in range(512)]  # fresh tokens: no prefix-cache hit
        times = stream_times(base_url, {"prompt": prompt, "max_tokens": 1})
        ttfts.append(times[1] - times[0])
    return {"itl_ms": 1000 * statistics.median(gaps), "ttft_512_ms": 1000 * statistics.median(ttfts)}


def measure(flags: list[str], log: Path, quick: bool = False) -> dict:
    with rill_server(*flags, log_path=log).wait_ready(900) as srv:
        asyncio.run(drive(srv.base_url, throughput_bodies(seed=9)[:8], 8))  # warm up
        out = {"latency": latency(srv.base_url)}
        bodies = throughput_bodies()[: 8 if quick else 64]
        out["throughput"] = asyncio.run(drive(srv.base_url, bodies, 8 if quick else 32))
        out["stats"] = httpx.get(f"{srv.base_url}/stats", timeout=30).json()
    return out


def report_markdown(report: dict) -> str:
    one, two = report["tp1"], report["tp2"]
    rows = []
    for label, path, unit in [("inter-token latency, concurrency 1 (median)", ("latency", "itl_ms"), "ms"),
                              ("TTFT of a 512-token prompt (median of 5)", ("latency", "ttft_512_ms"), "ms"),
                              ("output tok/s, concurrency 32 (128 in, 64 out)", ("throughput", "output_tok_s"), "")]:
        a, b = one[path[0]][path[1]], two[path[0]][path[1]]
        rows.append([label, f"{a:.1f} {unit}".strip(), f"{b:.1f} {unit}".strip(), f"{b / a:.2f}x"])
    cpu = report["machine"].get("cpu_model", "?")
    cores = report["machine"].get("cpu_count", "?")
    return (f"# Tensor parallelism: two ranks against one\n\n`{report['command']}` on {cpu} ({cores} cores), "
            f"{report['date']}; the bundled model ({one['stats'].get('dtype', '?')}), each server with its defaults "
            "otherwise (decode steps compiled).\n\n" + table(["figure", "TP=1", "TP=2", "TP=2 / TP=1"], rows) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-tp-"))
    one = measure([], tmp / "tp1.log")
    two = measure(["--tensor-parallel-size", "2"], tmp / "tp2.log")
    report = {**provenance("rill.bench.features.tensor_parallel", argv, args.machine), "tp1": one, "tp2": two}
    md = report_markdown(report)
    save_results(args.out / f"tensor_parallel-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
