"""The engine step's own CPU work (scheduler + sampler, logits standing in for the model) against
an earlier revision of the code, in one run: did preparing sampling inputs once per request
(engine_proc/sample/prepared.py) move an ordinary step?

    python -m rill.bench.kernels.sampler_step [--baseline-rev 5d1abf3] [--out bench/results/sampler_step-cpu.json]

Both sides run this same file in a subprocess each, from their own tree (the baseline's a
`git worktree` of its revision); batches of plain greedy rows, of seeded sampled rows, and of rows
using what clients commonly send (min_tokens, a few stop ids and logit_bias entries, the
penalties). One thread each (the step's work, not the scheduling of two threads on a busy
machine); each figure is the fastest of interleaved repetitions (noise only adds time).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOCAB_SIZE = 49_152  # the bundled model's
BATCHES = (1, 8, 32)
KINDS = ("greedy", "sampled", "features")
NUM_STEPS = 60


def _params(kind: str, i: int):
    from rill.ipc.protocol import SamplingParams

    if kind == "greedy":
        return SamplingParams(max_tokens=4096, temperature=0.0, ignore_eos=True)
    if kind == "sampled":
        return SamplingParams(max_tokens=4096, temperature=0.8, top_p=0.95, seed=i, ignore_eos=True)
    return SamplingParams(max_tokens=4096, temperature=0.7, top_k=50, seed=i, ignore_eos=True, min_tokens=4096,
                          stop_token_ids=[11, 12, 13], logit_bias={100: 2.0, 200: -5.0},
                          repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=0.2)


def _engine(kind: str, num_rows: int):
    from rill.engine_proc.sample.sampler import Sampler
    from rill.engine_proc.sched.block_manager import BlockManager
    from rill.engine_proc.sched.request import EngineRequest
    from rill.engine_proc.sched.scheduler import Scheduler

    scheduler = Scheduler(BlockManager(4096, 16), max_num_seqs=num_rows, max_num_batched_tokens=8192,
                          max_model_len=4096, eos_token_ids=[2])
    for i in range(num_rows):
        scheduler.add(EngineRequest(f"r{i}", "w", [100 + i + j for j in range(128)], _params(kind, i)))
    return scheduler, Sampler([2], seed=0)


def _step(scheduler, sampler, logits) -> float:
    started = time.perf_counter()
    batch = scheduler.schedule()
    seqs = batch.sampled_seqs
    scheduler.update(batch, sampler.sample(logits[: len(seqs)], seqs))
    return time.perf_counter() - started


def measure() -> dict[str, float]:
    """{kind/batch: the fastest step in ms}, every configuration's steps interleaved."""
    import torch

    torch.set_num_threads(1)
    logits = torch.randn(max(BATCHES), VOCAB_SIZE, generator=torch.Generator().manual_seed(0))
    engines = {f"{kind}/{n}": _engine(kind, n) for kind in KINDS for n in BATCHES}
    for eng in engines.values():
        for _ in range(3):  # the prefill, then the first samples (a request's prepared inputs are built once)
            _step(*eng, logits)
    best = {name: float("inf") for name in engines}
    for _ in range(NUM_STEPS):
        for name, eng in engines.items():
            best[name] = min(best[name], _step(*eng, logits))
    return {name: s * 1e3 for name, s in best.items()}


def _run_side(tree: Path) -> dict[str, float]:
    """measure() with `tree`'s engine_proc and ipc: this file run from that tree, which comes first on
    sys.path (PYTHONPATH too, as the editable install would otherwise find this checkout's)."""
    code = f"import runpy, sys; sys.argv = ['sampler_step', '--measure']; runpy.run_path({__file__!r}, run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                          capture_output=True, text=True, timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-rev", default="5d1abf3")
    ap.add_argument("--rounds", type=int, default=2, help="each side this many times, alternated")
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/sampler_step-cpu.json")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.measure:
        print(json.dumps(measure()))
        return {}
    from rill.bench.serving.markdown import table
    from rill.bench.serving.provenance import provenance

    with tempfile.TemporaryDirectory(prefix="rill-baseline-") as scratch:
        base = Path(scratch) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.baseline_rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            runs: dict[str, list[dict[str, float]]] = {"baseline": [], "this": []}
            for _ in range(args.rounds):
                runs["baseline"].append(_run_side(base))
                runs["this"].append(_run_side(ROOT))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    best = {side: {k: min(r[k] for r in rs) for k in rs[0]} for side, rs in runs.items()}
    ratios = {k: best["this"][k] / best["baseline"][k] for k in best["this"]}
    report = {"benchmark": "sampler_step", **provenance("rill.bench.kernels.sampler_step", argv, None),
              "baseline_rev": args.baseline_rev, "step_ms": best, "ratios": ratios}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    rows = [[k, f"{best['baseline'][k]:.3f}", f"{best['this'][k]:.3f}", f"{ratios[k]:.2f}x"] for k in best["this"]]
    md = ["# The engine step's CPU work outside the model, against an earlier revision", "",
          f"`{report['command']}` on {report['date']}, {report['machine']['cpu_model']}, one thread; the "
          f"fastest of {NUM_STEPS} interleaved steps, best of {args.rounds} alternated runs a side.", "",
          table(["rows/batch", f"{args.baseline_rev} ms", "this ms", "ratio"], rows), ""]
    args.out.with_suffix(".md").write_text("\n".join(md))
    print("\n".join(md))
    return report


if __name__ == "__main__":
    main()
