"""`python -m rill.bench.features.state_store`: what the shared state store costs a Responses API request.

For each store (the default SQLite in the run directory, a durable SQLite file, Redis when
`redis-server` is installed), a server with 2 API workers answers interleaved rounds of
non-streamed `POST /v1/responses` (one output token) with `store: true` and `store: false`, and
`GET /v1/responses/{id}`. The ratio stored / unstored is the store's whole cost to a create.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import free_port, rill_server

MODEL = "smollm2-135m-instruct"


def timed(fn) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def measure(base_url: str, rounds: int) -> dict:
    created, unstored, fetched = [], [], []
    with httpx.Client(base_url=base_url, timeout=60) as http:
        def create(store: bool) -> str:
            r = http.post("/v1/responses", json={"model": MODEL, "input": "Say yes.", "max_output_tokens": 1,
                                                 "store": store})
            r.raise_for_status()
            return r.json()["id"]

        ids = []
        for i in range(rounds + 2):  # two warm-up rounds
            t_stored = timed(lambda: ids.append(create(True)))
            t_unstored = timed(lambda: create(False))
            t_get = timed(lambda: http.get(f"/v1/responses/{ids[-1]}").raise_for_status())
            if i >= 2:
                created.append(t_stored)
                unstored.append(t_unstored)
                fetched.append(t_get)
    med = statistics.median
    return {"create_stored_ms": med(created), "create_unstored_ms": med(unstored), "get_ms": med(fetched),
            "ratio": med(created) / med(unstored)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-store-"))
    stores = {"sqlite (run dir)": "", "sqlite (durable file)": f"sqlite://{tmp}/state.db"}
    redis = None
    if shutil.which("redis-server"):
        port = free_port()
        redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        stores["redis"] = f"redis://127.0.0.1:{port}/0"
    results = {}
    try:
        for name, url in stores.items():
            flags = ("--workers", "2", *(("--state-store", url) if url else ()))
            with rill_server(*flags, log_path=tmp / f"{len(results)}.log").wait_ready() as srv:
                results[name] = measure(srv.base_url, args.rounds)
            print(name, results[name], flush=True)
    finally:
        if redis is not None:
            redis.terminate()
    report = {**provenance("rill.bench.features.state_store", argv, args.machine), "rounds": args.rounds, "results": results}
    rows = [[name, f"{r['create_stored_ms']:.1f}", f"{r['create_unstored_ms']:.1f}", f"{r['ratio']:.2f}x",
             f"{r['get_ms']:.1f}"] for name, r in results.items()]
    md = (f"# The state store's cost to a Responses API request\n\n`{report['command']}` on "
          f"{report['machine'].get('cpu_model', '?')}, {report['date']}; 2 API workers, medians of "
          f"{args.rounds} interleaved rounds, one output token.\n\n"
          + table(["store", "create, store: true (ms)", "create, store: false (ms)", "stored / unstored",
                   "GET /v1/responses/{id} (ms)"], rows) + "\n")
    save_results(args.out / f"state_store-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
