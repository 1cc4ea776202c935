"""`python -m rill.bench.features.startup`: how long `rill serve --enforce-eager` takes to answer /ready on the bundled
model, its config read by Rill's own reader (engine_proc/model/config_json.py: the native engine imports no
transformers) against the same model whose config.json holds one key the reader does not know, so that transformers
reads it as before. Everything else is the same files (links). Starts alternate, the median of each side counts;
the stop is timed too. Records the CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server
from rill.engine_proc.model.bundled import ensure_bundled_model


def transformers_read_copy(model_dir: Path, target: Path) -> Path:
    """`model_dir`'s files as links, but for a config.json with one key more, which sends it to transformers."""
    target.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.name != "config.json":
            (target / path.name).symlink_to(path.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "rill_bench_read_by": "transformers"}))
    return target


def timed_start(model_dir: Path, log: Path) -> tuple[float, float]:
    """(seconds to /ready, seconds to stop)."""
    started = time.perf_counter()
    server = rill_server("--model", str(model_dir), "--served-model-name", "bench", "--enforce-eager",
                         log_path=log).wait_ready(300)
    ready = time.perf_counter() - started
    stopping = time.perf_counter()
    assert server.stop() == 0, server.log()
    return ready, time.perf_counter() - stopping


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--starts", type=int, default=5, help="starts of each side")
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-startup-"))
    own = ensure_bundled_model()
    sides = {"own reader": own, "transformers": transformers_read_copy(own, tmp / "model")}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    timed_start(own, tmp / "warm.log")  # the page cache and the bytecode, for both sides
    for i in range(args.starts):
        for name, model_dir in sides.items():
            times[name].append(timed_start(model_dir, tmp / f"{name.replace(' ', '_')}-{i}.log"))
    medians = {name: (statistics.median(r for r, _ in runs), statistics.median(s for _, s in runs))
               for name, runs in times.items()}
    report = {**provenance("rill.bench.features.startup", argv, args.machine),
              "starts": {name: [{"ready_s": r, "stop_s": s} for r, s in runs] for name, runs in times.items()},
              "median_ready_s": {name: m[0] for name, m in medians.items()},
              "ratio": medians["own reader"][0] / medians["transformers"][0]}
    rows = [[name, f"{ready:.2f} s", f"{stop:.2f} s",
             ", ".join(f"{r:.2f}" for r, _ in times[name])] for name, (ready, stop) in medians.items()]
    cpu = report["machine"].get("cpu_model", "?")
    md = (f"# Server start: the native engine's config read without transformers\n\n`{report['command']}` on {cpu} "
          f"({report['machine'].get('cpu_count', '?')} cores), {report['date']}; `rill serve --enforce-eager`, the "
          f"bundled model, {args.starts} starts a side, alternating.\n\n"
          + table(["config read by", "median to /ready", "median stop", "each start to /ready (s)"], rows)
          + f"\n\nOwn reader / transformers: **{report['ratio']:.2f}x** the time to /ready.\n")
    save_results(args.out / f"startup-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
