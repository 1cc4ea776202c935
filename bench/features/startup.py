"""`python -m rill.bench.features.startup`: how long `rill serve --enforce-eager` takes to answer /ready on the bundled
model, its config read by Rill's own reader (engine_proc/model/config_json.py: the native engine imports no
transformers) against the same model whose config.json holds one key the reader does not know, so that transformers
reads it as before. Everything else is the same files (links). Starts alternate, the median of each side counts;
the stop is timed too. Records the CPU. `--rope llama3`: both sides with Llama 3.2's RoPE scaling in the config (which
Rill's reader and engine_proc/model/rope.py compute without transformers).
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

LLAMA_3_2_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def linked_copy(model_dir: Path, target: Path, **changes) -> Path:
    """`model_dir`'s files as links, but for a config.json with `changes`."""
    target.mkdir(parents=True, exist_ok=True)
    for path in model_dir.iterdir():
        if path.name != "config.json":
            (target / path.name).symlink_to(path.resolve())
    config = json.loads((model_dir / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, **changes}))
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
    ap.add_argument("--rope", choices=["model", "llama3"], default="model",
                    help="the bundled model's RoPE, or Llama 3.2's scaling on both sides")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-startup-"))
    own = ensure_bundled_model()
    if args.rope == "llama3":
        rope = json.loads((own / "config.json").read_text())["rope_parameters"]
        own = linked_copy(own, tmp / "llama3", rope_parameters={**rope, **LLAMA_3_2_ROPE})
    sides = {"own reader": own, "transformers": linked_copy(own, tmp / "model", rill_bench_read_by="transformers")}
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
          f"bundled model{', with Llama 3.2 RoPE scaling' if args.rope == 'llama3' else ''}, {args.starts} starts a "
          "side, alternating.\n\n"
          + table(["config read by", "median to /ready", "median stop", "each start to /ready (s)"], rows)
          + f"\n\nOwn reader / transformers: **{report['ratio']:.2f}x** the time to /ready.\n")
    name = "startup" if args.rope == "model" else f"startup-{args.rope}"
    save_results(args.out / f"{name}-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
