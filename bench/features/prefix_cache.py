"""`python -m rill.bench.features.prefix_cache`: TTFT of a request sharing a long prefix with an earlier one.

Each round draws a fresh random prefix (1,000 token ids by default), sends prefix + suffix A
(cold: nothing cached), then prefix + suffix B (the prefix's full blocks are cached), and times
each to its first streamed token. The ratio warm/cold is issue 4's target (at most 0.25x).
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

TARGET = 0.25


def ttft_ms(base_url: str, model: str, prompt_ids: list[int]) -> tuple[float, int]:
    """Time to the first streamed token, and the cached prompt tokens the usage reports."""
    body = {"model": model, "prompt": prompt_ids, "max_tokens": 2, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": 0}
    started = time.perf_counter()
    first = None
    cached = 0
    with httpx.stream("POST", f"{base_url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"text"' in line:
                first = time.perf_counter()
            if '"usage":{' in line:
                cached = json.loads(line[len("data: "):])["usage"]["prompt_tokens_details"]["cached_tokens"]
    return (first - started) * 1000, cached


def run(base_url: str, model: str, rounds: int, prefix_len: int, suffix_len: int, vocab: int) -> list[dict]:
    rng = random.Random(1234)
    rows = []
    ttft_ms(base_url, model, [rng.randrange(100, vocab) for _ in range(64)])  # warm-up
    for round_idx in range(rounds):
        prefix = [rng.randrange(100, vocab) for _ in range(prefix_len)]
        cold_ms, cold_cached = ttft_ms(base_url, model, prefix + [rng.randrange(100, vocab) for _ in range(suffix_len)])
        warm_ms, warm_cached = ttft_ms(base_url, model, prefix + [rng.randrange(100, vocab) for _ in range(suffix_len)])
        rows.append({"round": round_idx, "cold_ttft_ms": cold_ms, "warm_ttft_ms": warm_ms, "ratio": warm_ms / cold_ms,
                     "cold_cached_tokens": cold_cached, "warm_cached_tokens": warm_cached})
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.features.prefix_cache", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefix-len", type=int, default=1000)
    ap.add_argument("--suffix-len", type=int, default=24)
    ap.add_argument("--quick", action="store_true", help="2 rounds, a 64-token prefix: checks that it runs")
    ap.add_argument("--out", type=Path, default=Path("bench/results/prefix_cache-cpu.json"))
    args = ap.parse_args(argv)
    rounds, prefix_len = (2, 64) if args.quick else (args.rounds, args.prefix_len)
    with tempfile.TemporaryDirectory(prefix="rill-bench-") as scratch:
        # --quick checks the plumbing only: it skips the ~30 s compile of decode steps at start.
        eager = ("--enforce-eager",) if args.quick else ()
        with rill_server("--max-model-len", "2048", *eager, log_path=Path(scratch) / "rill.log") as srv:
            model = httpx.get(f"{srv.base_url}/v1/models").json()["data"][0]["id"]
            rows = run(srv.base_url, model, rounds, prefix_len, args.suffix_len, vocab=49152)
    ratio = statistics.median(r["ratio"] for r in rows)
    report = {"benchmark": "prefix_cache", **provenance("rill.bench.features.prefix_cache", argv, None),
              "params": {"rounds": rounds, "prefix_len": prefix_len, "suffix_len": args.suffix_len},
              "rounds": rows, "median_ratio": ratio, "target": TARGET, "pass": ratio <= TARGET}
    lines = [f"# Prefix caching: TTFT with a shared {prefix_len}-token prefix", "",
             f"`{report['command']}` on {report['date']}, {report['machine']['cpu_count']} CPUs.", "",
             table(["round", "cold TTFT ms", "warm TTFT ms", "warm / cold", "cached tokens (cold, warm)"],
                   [[r["round"], f"{r['cold_ttft_ms']:.0f}", f"{r['warm_ttft_ms']:.0f}", f"{r['ratio']:.2f}x",
                     f"{r['cold_cached_tokens']}, {r['warm_cached_tokens']}"] for r in rows]), "",
             f"Median warm / cold: **{ratio:.2f}x** (target at most {TARGET}x: "
             f"{'PASS' if report['pass'] else 'FAIL'}).", ""]
    save_results(args.out, report, "\n".join(lines))
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
