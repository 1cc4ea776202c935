"""The KV cache's pages: `torch.zeros` under the engine's THP_MEM_ALLOC_ENABLE=1 (huge pages) against
`resident_zeros` (ordinary pages, engine_proc/model/memory.py), in one process, rounds interleaved.

Two figures each: the allocation of the cache (the engine's start: the first round's is what a fresh process sees;
later rounds of torch.zeros reuse the huge pages its allocator kept), and a decode step's attention over it (the C++
kernel, every layer's K and V of `--batch` sequences of `--context` tokens, their blocks scattered).

    python -m rill.bench.kernels.kv_pages [--gib 1] [--batch 32] [--context 2048] [--rounds 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as the launcher starts the engine; before torch's allocator runs

import torch  # noqa: E402

from rill.bench.serving.markdown import table  # noqa: E402
from rill.bench.serving.provenance import provenance, save_results  # noqa: E402
from rill.engine_proc.kernels import extension  # noqa: E402
from rill.engine_proc.model.memory import resident_zeros  # noqa: E402

# Qwen2.5-1.5B's KV shape: 28 layers, 2 KV heads of 128; blocks of 16 tokens
LAYERS, KV_HEADS, HEAD_DIM, Q_HEADS, BLOCK = 28, 2, 128, 12, 16
KINDS = {"huge pages (torch.zeros)": lambda shape: torch.zeros(shape, dtype=torch.bfloat16),
         "ordinary pages (resident_zeros)": lambda shape: resident_zeros(shape, torch.bfloat16)}


def alloc_s(kind: str, gib: float) -> float:
    blocks = int(gib * 2**30) // (LAYERS * 2 * BLOCK * KV_HEADS * HEAD_DIM * 2)
    start = time.perf_counter()
    cache = KINDS[kind]((LAYERS, 2, blocks, BLOCK, KV_HEADS, HEAD_DIM))
    elapsed = time.perf_counter() - start
    del cache
    return elapsed


def attention_ms(kind: str, batch: int, context: int, steps: int = 10) -> float:
    """The median of `steps` decode steps' attention over every layer (after three to warm up)."""
    num_blocks = batch * context // BLOCK + 1
    cache = KINDS[kind]((LAYERS, 2, num_blocks, BLOCK, KV_HEADS, HEAD_DIM))
    cache.normal_()
    table_ = (torch.randperm(num_blocks - 1, generator=torch.Generator().manual_seed(0))[: num_blocks - 1] + 1)
    table_ = table_.view(batch, -1).long()
    lens = torch.full((batch,), context, dtype=torch.long)
    q = torch.randn(batch, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    times = []
    for i in range(steps + 3):
        start = time.perf_counter()
        for layer in range(LAYERS):
            torch.ops.rill_cpu.paged_decode(q, cache[layer, 0], cache[layer, 1], table_, lens)
        if i >= 3:
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.kv_pages", description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="the cache whose allocation is timed")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results/kv_pages-cpu.json"))
    args = ap.parse_args(argv)
    if not extension.available():
        raise SystemExit("the CPU kernels are not built: nothing to measure")
    results = {kind: {"alloc_s": [], "attention_ms": []} for kind in KINDS}
    for _ in range(args.rounds):
        for kind in KINDS:
            results[kind]["alloc_s"].append(alloc_s(kind, args.gib))
            results[kind]["attention_ms"].append(attention_ms(kind, args.batch, args.context))
    medians = {kind: {k: statistics.median(v) for k, v in r.items()} for kind, r in results.items()}
    huge, ordinary = (medians[kind] for kind in KINDS)
    first = {kind: r["alloc_s"][0] for kind, r in results.items()}
    ratios = {"first_alloc": first[list(KINDS)[1]] / first[list(KINDS)[0]],
              "attention": ordinary["attention_ms"] / huge["attention_ms"]}
    report = {**provenance("rill.bench.kernels.kv_pages", argv, args.machine),
              "params": {"gib": args.gib, "batch": args.batch, "context": args.context, "rounds": args.rounds,
                         "threads": torch.get_num_threads(), "THP_MEM_ALLOC_ENABLE": os.environ["THP_MEM_ALLOC_ENABLE"]},
              "results": results, "medians": medians, "ratios": ratios}
    rows = [[kind, f"{first[kind] * 1e3:.0f}", f"{m['alloc_s'] * 1e3:.0f}", f"{m['attention_ms']:.1f}"]
            for kind, m in medians.items()]
    summary = "\n".join([
        "# The KV cache's pages: huge against ordinary", "",
        f"`{report['command']}` on {report['date']}, {report['machine']['cpu_model']}, {torch.get_num_threads()} "
        f"threads; medians of {args.rounds} interleaved rounds.", "",
        table(["storage", f"allocate {args.gib:g} GiB first, ms", "later (median), ms", f"attention, {LAYERS} layers x {args.batch} x "
               f"{args.context} tokens, ms"], rows), "",
        f"Ordinary pages against huge: the first allocation **{ratios['first_alloc']:.2f}x**, attention "
        f"**{ratios['attention']:.2f}x**.",
        ""])
    save_results(args.out, report, summary)
    print(summary)
    return report


if __name__ == "__main__":
    main()
