"""`python -m rill.bench.features.data_parallel`: `rill serve --data-parallel-size 2` against `rill serve` (one engine),
each otherwise with its defaults, the bundled model, the same requests.

1. Throughput: concurrency 32, 64 requests of 128 random tokens in and 64 forced tokens out.
2. Shared prefixes: 8 documents of 512 tokens, each asked 8 questions (32 tokens, 16 out) at
   concurrency 16, in a shuffled order: what prefix-aware routing keeps of the prefix cache (its
   hit rate from /stats) and the mean TTFT.

Records the CPU: on a 2-core machine two engines share the same two cores.
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

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

MODEL = "smollm2-135m-instruct"


def throughput_bodies(seed: int = 0) -> list[dict]:
    gen = random.Random(seed)
    return [{"prompt": [gen.randrange(1000, 40000) for _ in range(128)], "max_tokens": 64, "ignore_eos": True}
            for _ in range(64)]


def prefix_bodies(seed: int = 1) -> list[dict]:
    gen = random.Random(seed)
    docs = [[gen.randrange(1000, 40000) for _ in range(512)] for _ in range(8)]
    bodies = [{"prompt": doc + [gen.randrange(1000, 40000) for _ in range(32)], "max_tokens": 16,
               "ignore_eos": True} for doc in docs for _ in range(8)]
    gen.shuffle(bodies)
    return bodies


async def drive(base_url: str, bodies: list[dict], concurrency: int) -> dict:
    queue: asyncio.Queue = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    ttfts: list[float] = []
    tokens = 0

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while not queue.empty():
            body = queue.get_nowait()
            sent = time.perf_counter()
            first = None
            async with http.stream("POST", "/v1/completions", json={"model": MODEL, "temperature": 0, "stream": True,
                                                                     **body}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        first = first or time.perf_counter()
                        tokens += 1
            ttfts.append(first - sent)

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=600,
                                 limits=httpx.Limits(max_connections=concurrency)) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {"output_tok_s": tokens / elapsed, "mean_ttft_ms": 1000 * statistics.mean(ttfts), "seconds": elapsed}


def measure(flags: list[str], log: Path) -> dict:
    with rill_server(*flags, log_path=log).wait_ready(600) as srv:
        asyncio.run(drive(srv.base_url, throughput_bodies(seed=9)[:8], 8))  # warm up
        out = {"throughput": asyncio.run(drive(srv.base_url, throughput_bodies(), 32))}
        before = httpx.get(f"{srv.base_url}/stats", timeout=30).json()
        out["prefix"] = asyncio.run(drive(srv.base_url, prefix_bodies(), 16))
        after = httpx.get(f"{srv.base_url}/stats", timeout=30).json()
        queried = after["num_prefix_queries_tokens"] - before["num_prefix_queries_tokens"]
        out["prefix"]["hit_rate"] = (after["num_prefix_hit_tokens"] - before["num_prefix_hit_tokens"]) / queried
        out["engines"] = len(after["engines"])
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-dp-"))
    one = measure([], tmp / "dp1.log")
    two = measure(["--data-parallel-size", "2"], tmp / "dp2.log")
    report = {**provenance("rill.bench.features.data_parallel", argv, args.machine), "dp1": one, "dp2": two}
    rows = [["output tok/s, concurrency 32 (128 in, 64 out)", f"{one['throughput']['output_tok_s']:.0f}",
             f"{two['throughput']['output_tok_s']:.0f}",
             f"{two['throughput']['output_tok_s'] / one['throughput']['output_tok_s']:.2f}x"],
            ["shared prefixes: prefix-cache hit rate", f"{one['prefix']['hit_rate']:.2f}",
             f"{two['prefix']['hit_rate']:.2f}", ""],
            ["shared prefixes: mean TTFT", f"{one['prefix']['mean_ttft_ms']:.0f} ms",
             f"{two['prefix']['mean_ttft_ms']:.0f} ms",
             f"{two['prefix']['mean_ttft_ms'] / one['prefix']['mean_ttft_ms']:.2f}x"],
            ["shared prefixes: output tok/s", f"{one['prefix']['output_tok_s']:.0f}",
             f"{two['prefix']['output_tok_s']:.0f}",
             f"{two['prefix']['output_tok_s'] / one['prefix']['output_tok_s']:.2f}x"]]
    cpu = report["machine"].get("cpu_model", "?")
    cores = report["machine"].get("cpu_count", "?")
    md = (f"# Data parallelism: two engines against one\n\n`{report['command']}` on {cpu} ({cores} cores), "
          f"{report['date']}; the bundled model, each server with its defaults otherwise.\n\n"
          + table(["figure", "1 engine", "2 engines", "2 / 1"], rows) + "\n")
    save_results(args.out / f"data_parallel-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
