"""`python -m rill.bench.kernels.top_logprobs`: a step's top-k logprobs (engine_proc/sample/top_logprobs.py) against
the whole-vocabulary stable sort it replaced, the same rows, on this CPU: rows of the bundled model's vocabulary
(49,152), k = 5 and 20, 1 to 32 rows a step. Both give the same ids in the same order (checked here on each shape,
on bfloat16-rounded logprobs, whose ties are common).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.sample.top_logprobs import gather_logprobs

VOCAB = 49_152
SHAPES = [(rows, k) for k in (5, 20) for rows in (1, 8, 32)]


def full_sort(raw: torch.Tensor, token_ids: torch.Tensor, k: int):
    """The baseline: the whole vocabulary sorted, stable, descending."""
    values, ids = raw.sort(dim=-1, descending=True, stable=True)
    ranks = (raw >= raw.gather(1, token_ids.unsqueeze(1))).sum(dim=-1)
    return values[:, :k].numpy(), ids[:, :k].numpy(), ranks.numpy()


def timed(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats * 1e3


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    rows_out = []
    for rows, k in SHAPES:
        raw = torch.randn(rows, VOCAB).to(torch.bfloat16).float().log_softmax(dim=-1)
        chosen = raw.argmax(dim=-1)
        new = gather_logprobs(raw, chosen, [k] * rows)
        _, base_ids, base_ranks = full_sort(raw, chosen, k)
        assert all((lp.token_ids[0, 1:] == base_ids[i]).all() and lp.ranks[0] == base_ranks[i] for i, lp in enumerate(new))
        base_ms = timed(lambda: full_sort(raw, chosen, k), args.repeats)
        new_ms = timed(lambda: gather_logprobs(raw, chosen, [k] * rows), args.repeats)
        rows_out.append({"rows": rows, "k": k, "full_sort_ms": base_ms, "top_ms": new_ms, "ratio": new_ms / base_ms})
    report = {**provenance("rill.bench.kernels.top_logprobs", argv, args.machine), "vocab": VOCAB,
              "threads": torch.get_num_threads(), "results": rows_out}
    machine = report["machine"]
    md = (f"# Top-k logprobs of a step against the whole-vocabulary sort\n\n`{report['command']}` on "
          f"{machine.get('cpu_model', '?')} ({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), "
          f"{report['date']}; {VOCAB:,} logprobs a row, {report['threads']} threads; the same ids, order and ranks "
          f"checked on every shape.\n\n"
          + table(["rows a step", "k", "whole sort", "top-k", "ratio"],
                  [[r["rows"], r["k"], f"{r['full_sort_ms']:.2f} ms", f"{r['top_ms']:.3f} ms", f"{r['ratio']:.3f}x"]
                   for r in rows_out]) + "\n")
    save_results(args.out / f"top_logprobs-{machine['name']}.json", report, md)
    print(md)
    return report


if __name__ == "__main__":
    main()
