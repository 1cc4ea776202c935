"""`python -m rill.bench.features.batch_itl`: interactive latency with a large batch running, on one `rill serve`
of the bundled model with its defaults (--batch-concurrency 4).

Interactive requests go one at a time (concurrency 1), streamed: 128 random prompt tokens, 64 forced output
tokens. They run four ways, in one server and one run, so that the ratios hold on a noisy machine:
1. alone;
2. while a batch of `--batch-lines` such requests runs through the Batch API (paced by the runner:
   asgi/batch/pacing.py);
3. while the same load goes in as four plain concurrent requests at a time (what the batch would cost
   without its pacing);
4. alone again (the drift of the machine over the run).
Latency is the inter-token latency (ITL: the median gap between streamed tokens) and the time per output
token (TPOT). The batch's own progress while interactive requests ran is recorded: pacing must slow it,
never stop it.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from rill.bench.features.speculative import MODEL, random_bodies, run
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

INPUT_LEN, OUTPUT_LEN = 128, 64


def itl(results: list[dict]) -> dict:
    gaps = [b - a for r in results for a, b in zip(r["times"][1:], r["times"][2:])]
    tpots = [(r["times"][-1] - r["times"][1]) / (r["tokens"] - 1) for r in results if r["tokens"] > 1]
    return {"itl_ms": 1000 * statistics.median(gaps), "tpot_ms": 1000 * statistics.mean(tpots),
            "p90_itl_ms": 1000 * statistics.quantiles(gaps, n=10)[-1], "requests": len(results)}


def start_batch(url: str, num_lines: int) -> str:
    lines = [{"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions",
              "body": {"model": MODEL, "temperature": 0, **body}}
             for i, body in enumerate(random_bodies(num_lines, INPUT_LEN, OUTPUT_LEN, seed=1))]
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    source = httpx.post(f"{url}/v1/files", files={"file": ("bench.jsonl", io.BytesIO(data))},
                        data={"purpose": "batch"}, timeout=60).json()
    batch = httpx.post(f"{url}/v1/batches", json={"input_file_id": source["id"], "endpoint": "/v1/completions",
                                                   "completion_window": "24h"}, timeout=60).json()
    return batch["id"]


def batch_state(url: str, batch_id: str) -> dict:
    return httpx.get(f"{url}/v1/batches/{batch_id}", timeout=30).json()


async def with_load(url: str, interactive: list[dict], load: list[dict], concurrency: int) -> list[dict]:
    background = asyncio.create_task(run(url, load, concurrency))
    await asyncio.sleep(2.0)  # the load is running
    try:
        return await run(url, interactive, 1)
    finally:
        background.cancel()
        try:
            await background
        except (asyncio.CancelledError, httpx.HTTPError):
            pass


def measure(flags: list[str], log: Path, num_requests: int, num_lines: int) -> dict:
    interactive = random_bodies(num_requests, INPUT_LEN, OUTPUT_LEN, seed=2)
    with rill_server(*flags, log_path=log).wait_ready(900) as srv:
        url = srv.base_url
        asyncio.run(run(url, random_bodies(8, INPUT_LEN, OUTPUT_LEN, seed=9), 4))  # warm up
        out = {"alone": itl(asyncio.run(run(url, interactive, 1)))}
        batch_id = start_batch(url, num_lines)
        deadline = time.monotonic() + 120
        while batch_state(url, batch_id)["request_counts"]["completed"] < 4 and time.monotonic() < deadline:
            time.sleep(0.5)  # running at its full concurrency
        before = batch_state(url, batch_id)["request_counts"]["completed"]
        started = time.perf_counter()
        out["with_batch"] = itl(asyncio.run(run(url, interactive, 1)))
        elapsed = time.perf_counter() - started
        after = batch_state(url, batch_id)["request_counts"]["completed"]
        out["batch_lines_during_interactive"] = after - before
        out["batch_lines_per_s_during_interactive"] = (after - before) / elapsed
        httpx.post(f"{url}/v1/batches/{batch_id}/cancel", timeout=30)
        while batch_state(url, batch_id)["status"] != "cancelled" and time.monotonic() < deadline + 120:
            time.sleep(0.5)
        load = random_bodies(num_lines, INPUT_LEN, OUTPUT_LEN, seed=1)
        out["with_unpaced_load"] = itl(asyncio.run(with_load(url, interactive, load, 4)))
        out["alone_again"] = itl(asyncio.run(run(url, interactive, 1)))
        out["dtype"] = httpx.get(f"{url}/stats", timeout=30).json().get("dtype")
    return out


def report_markdown(report: dict) -> str:
    f, machine = report["figures"], report["machine"]
    base = (f["alone"]["itl_ms"] + f["alone_again"]["itl_ms"]) / 2
    rows = [[name, f"{f[key]['itl_ms']:.2f} ms", f"{f[key]['p90_itl_ms']:.2f} ms", f"{f[key]['tpot_ms']:.2f} ms",
             f"{f[key]['itl_ms'] / base:.2f}x"]
            for name, key in [("alone", "alone"), ("with a batch running (paced)", "with_batch"),
                              ("with the same load as 4 plain concurrent requests", "with_unpaced_load"),
                              ("alone again", "alone_again")]]
    return (f"# Interactive latency with a batch running\n\n`{report['command']}` on {machine.get('cpu_model', '?')} "
            f"({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), {report['date']}; the bundled "
            f"model ({f['dtype']}), `rill serve` with its defaults (--batch-concurrency 4); interactive requests at "
            f"concurrency 1, {INPUT_LEN} prompt tokens, {OUTPUT_LEN} output tokens each.\n\n"
            + table(["interactive requests", "ITL (median)", "ITL p90", "TPOT", "ITL / alone"], rows)
            + f"\n\nThe batch completed {f['batch_lines_during_interactive']} lines "
              f"({f['batch_lines_per_s_during_interactive']:.2f} a second) while the interactive requests ran: "
              "slowed, not stopped.\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--requests", type=int, default=6, help="interactive requests in each phase")
    ap.add_argument("--batch-lines", type=int, default=400, help="lines of the batch (it is cancelled at the end)")
    ap.add_argument("--quick", action="store_true", help="an eager server, 2 requests: checks the bench runs")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-batch-"))
    flags = ["--enforce-eager"] if args.quick else []
    figures = measure(flags, tmp / "server.log", 2 if args.quick else args.requests, args.batch_lines)
    report = {**provenance("rill.bench.features.batch_itl", argv, args.machine), "figures": figures}
    md = report_markdown(report)
    if not args.quick:
        save_results(args.out / f"batch_itl-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
