"""`python -m rill.bench.features.priority`: interactive requests' time to first token behind a burst of bulk work,
with the bulk sent at the interactive requests' own priority (first come, first served) and at a worse one, on one
`rill serve --scheduling-policy priority` of the bundled model with 16 seats (--max-num-seqs 16), saturated.

Each phase sends the bulk requests at once (128 random prompt tokens, 64 forced output tokens), then an interactive
chat request (16 tokens) every 0.5 s, each on its own, while the bulk still runs, and records their TTFT; then
waits for the bulk to finish. Phase "same priority" sends
everything at priority 0 (the queue is then first come, first served); phase "bulk at 10" sends the bulk at
priority 10. Both phases run on the same server, one after the other.
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

from rill.bench.features.speculative import MODEL
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

FLAGS = ["--scheduling-policy", "priority", "--max-num-seqs", "16"]
INTERACTIVE_GAP_S = 0.5


async def ttft(http: httpx.AsyncClient, body: dict) -> float:
    started = time.perf_counter()
    async with http.stream("POST", "/v1/chat/completions", json={"model": MODEL, "stream": True, **body}) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                return time.perf_counter() - started
    raise RuntimeError("no token came")


async def phase(url: str, bulk_priority: int, num_bulk: int, num_interactive: int, seed: int) -> dict:
    gen = random.Random(seed)
    async with httpx.AsyncClient(base_url=url, timeout=900, limits=httpx.Limits(max_connections=num_bulk + 4)) as http:
        bulk = [asyncio.create_task(http.post("/v1/completions", json={
            "model": MODEL, "prompt": [gen.randrange(1000, 40000) for _ in range(128)], "max_tokens": 64,
            "ignore_eos": True, "priority": bulk_priority})) for _ in range(num_bulk)]
        interactive = []
        for i in range(num_interactive):  # one every INTERACTIVE_GAP_S while the bulk runs, each on its own
            await asyncio.sleep(INTERACTIVE_GAP_S)
            interactive.append(asyncio.create_task(ttft(http, {
                "messages": [{"role": "user", "content": f"Say a number near {i}."}], "max_tokens": 16,
                "priority": 0})))
        times = await asyncio.gather(*interactive)
        answers = await asyncio.gather(*bulk)
        assert all(a.status_code == 200 for a in answers)
        return {"ttft_s": times, "median_ttft_ms": 1000 * statistics.median(times),
                "max_ttft_ms": 1000 * max(times)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true", help="fewer requests, an eager server: checks the bench runs")
    args = ap.parse_args(argv)
    num_bulk, num_interactive = (24, 3) if args.quick else (64, 8)
    log = Path(tempfile.mkdtemp(prefix="rill-bench-priority-")) / "server.log"
    with rill_server(*FLAGS, *(["--enforce-eager"] if args.quick else []), log_path=log).wait_ready(900) as srv:
        asyncio.run(phase(srv.base_url, 0, 8, 1, seed=1))  # warm up
        same = asyncio.run(phase(srv.base_url, 0, num_bulk, num_interactive, seed=2))
        worse = asyncio.run(phase(srv.base_url, 10, num_bulk, num_interactive, seed=2))
        stats = httpx.get(f"{srv.base_url}/stats", timeout=30).json()
    report = {**provenance("rill.bench.features.priority", argv, args.machine), "flags": FLAGS,
              "num_bulk": num_bulk, "num_interactive": num_interactive, "same_priority": same, "bulk_at_10": worse,
              "num_preemptions": stats["num_preemptions"], "dtype": stats.get("dtype")}
    machine = report["machine"]
    rows = [[label, f"{same[key]:.0f} ms", f"{worse[key]:.0f} ms", f"{worse[key] / same[key]:.2f}x"]
            for label, key in [("interactive TTFT, median", "median_ttft_ms"), ("interactive TTFT, max", "max_ttft_ms")]]
    md = (f"# Priority scheduling: interactive TTFT behind bulk work\n\n`{report['command']}` on "
          f"{machine.get('cpu_model', '?')} ({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), "
          f"{report['date']}; the bundled model ({report['dtype']}), `rill serve {' '.join(FLAGS)}`; {num_bulk} bulk "
          f"requests (128 in, 64 out) at once, then {num_interactive} interactive chat requests, one every "
          f"{INTERACTIVE_GAP_S} s while the bulk runs.\n\n"
          + table(["figure", "bulk at priority 0 (FCFS)", "bulk at priority 10", "ratio"], rows)
          + f"\n\nPreemptions over the run: {report['num_preemptions']}.\n")
    if not args.quick:
        save_results(args.out / f"priority-{machine['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
