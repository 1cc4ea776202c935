"""`python -m rill.bench.features.speculative`: `rill serve --speculative-config` (ngram) against `rill serve` without it,
each otherwise with its defaults, the bundled model, the same requests, servers one after the other.

1. A workload that copies from its prompt, concurrency 1: chat requests asking the model to repeat a
   passage of bench/data/opticks.txt word for word, greedy, 128 tokens at most.
2. One that does not, concurrency 1: chat questions of bench/data/conversations.jsonl, greedy, each
   to its own length or its end.
3. Throughput, concurrency 32: 64 of those questions; and 64 requests of 128 random tokens in and 64
   forced tokens out (the peers' workload, whose outputs fall into loops that n-grams predict).

With drafts a step streams several tokens in one event, so latency is the time per output token
(TPOT: from the first token to the last, over the tokens after the first, counted by the usage the
server returns), not the gap between events; the median gap between events is recorded beside it.
"""
from __future__ import annotations

import argparse
import asyncio
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

MODEL = "smollm2-135m-instruct"
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
OPTICKS = Path(__file__).parents[1] / "data" / "opticks.txt"


def passages(num: int) -> list[str]:
    paragraphs = [" ".join(p.split()) for p in OPTICKS.read_text().split("\n\n")]
    return [p for p in paragraphs if 500 <= len(p) <= 900][:num]


def copy_bodies(num: int = 3) -> list[dict]:
    return [{"messages": [{"role": "user", "content": f"Repeat the following passage exactly, word for word:\n\n{p}"}],
             "max_tokens": 128} for p in passages(num)]


def chat_bodies(num: int) -> list[dict]:
    rows = [json.loads(line) for line in (Path(__file__).parents[1] / "data" / "conversations.jsonl").open()]
    return [{"messages": [{"role": "user", "content": r["prompt"]}], "max_tokens": r["output_len"]}
            for r in rows[:num]]


def random_bodies(num: int, input_len: int, output_len: int, seed: int) -> list[dict]:
    gen = random.Random(seed)
    return [{"prompt": [gen.randrange(1000, 40000) for _ in range(input_len)], "max_tokens": output_len,
             "ignore_eos": True} for _ in range(num)]


async def one(http: httpx.AsyncClient, body: dict) -> dict:
    """Streams one request: event times and its completion tokens (from the usage chunk)."""
    route = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    times = [time.perf_counter()]
    tokens = 0
    async with http.stream("POST", route, json={"model": MODEL, "temperature": 0, "stream": True,
                                                "stream_options": {"include_usage": True}, **body}) as r:
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if any((c.get("text") or (c.get("delta") or {}).get("content")) for c in chunk["choices"]):
                times.append(time.perf_counter())
    return {"times": times, "tokens": tokens}


async def run(base_url: str, bodies: list[dict], concurrency: int) -> list[dict]:
    queue = list(bodies)
    out = []

    async def worker(http):
        while queue:
            out.append(await one(http, queue.pop(0)))

    async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                 limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
    return out


def latency(results: list[dict]) -> dict:
    tpots = [(r["times"][-1] - r["times"][1]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1]
    gaps = [b - a for r in results for a, b in zip(r["times"][1:], r["times"][2:])]
    return {"tpot_ms": 1000 * statistics.mean(tpots), "median_event_gap_ms": 1000 * statistics.median(gaps),
            "tokens": sum(r["tokens"] for r in results)}


def measure(flags: list[str], log: Path, quick: bool) -> dict:
    with rill_server(*flags, log_path=log).wait_ready(900) as srv:
        url = srv.base_url
        asyncio.run(run(url, random_bodies(8, 128, 16, seed=9), 8))  # warm up
        out = {"copy": latency(asyncio.run(run(url, copy_bodies(1 if quick else 3), 1))),
               "chat": latency(asyncio.run(run(url, chat_bodies(2 if quick else 6), 1)))}
        for name, bodies in [("throughput", chat_bodies(8 if quick else 64)),
                             ("throughput_random", random_bodies(8 if quick else 64, 128, 64, seed=0))]:
            started = time.perf_counter()
            results = asyncio.run(run(url, bodies, 8 if quick else 32))
            out[name] = {"output_tok_s": sum(r["tokens"] for r in results) / (time.perf_counter() - started)}
        out["stats"] = httpx.get(f"{url}/stats", timeout=30).json()
    return out


def report_markdown(report: dict) -> str:
    base, spec = report["off"], report["ngram"]
    rows = []
    for label, path, unit, fmt in [
        ("copying workload, concurrency 1: time per output token", ("copy", "tpot_ms"), "ms", ".2f"),
        ("the same: median gap between streamed events", ("copy", "median_event_gap_ms"), "ms", ".2f"),
        ("chat questions, concurrency 1: time per output token", ("chat", "tpot_ms"), "ms", ".2f"),
        ("chat questions, output tok/s at concurrency 32", ("throughput", "output_tok_s"), "", ".0f"),
        ("random 128 in / 64 forced out, output tok/s at concurrency 32", ("throughput_random", "output_tok_s"),
         "", ".0f"),
    ]:
        a, b = base[path[0]][path[1]], spec[path[0]][path[1]]
        rows.append([label, f"{a:{fmt}} {unit}".strip(), f"{b:{fmt}} {unit}".strip(), f"{b / a:.2f}x"])
    stats = spec["stats"]
    machine = report["machine"]
    return (f"# Speculative decoding (ngram) against none\n\n`{report['command']}` on "
            f"{machine.get('cpu_model', '?')} ({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), "
            f"{report['date']}; the bundled model ({base['stats'].get('dtype', '?')}), each server with its defaults "
            f"otherwise; speculative: `{json.dumps(report['spec_config'])}`.\n\n"
            + table(["figure", "off", "ngram", "ngram / off"], rows)
            + f"\n\nAcceptance over the whole run: {stats.get('spec_acceptance_rate', 0):.2f} of "
              f"{stats.get('num_spec_draft_tokens', 0)} draft tokens, by position "
              f"{stats.get('spec_accepted_per_pos')} of {stats.get('num_spec_drafts', 0)} drafts.\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--config", default=json.dumps(NGRAM), help="the --speculative-config to measure")
    ap.add_argument("--quick", action="store_true", help="a few requests, eager servers: checks the bench runs")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-spec-"))
    eager = ["--enforce-eager"] if args.quick else []
    off = measure(eager, tmp / "off.log", args.quick)
    spec = measure([*eager, "--speculative-config", args.config], tmp / "ngram.log", args.quick)
    report = {**provenance("rill.bench.features.speculative", argv, args.machine), "spec_config": json.loads(args.config),
              "off": off, "ngram": spec}
    md = report_markdown(report)
    if not args.quick:
        save_results(args.out / f"speculative-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
