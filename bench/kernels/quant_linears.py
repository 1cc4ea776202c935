"""`python -m rill.bench.kernels.quant_linears`: int8 linears against float32 and bfloat16 ones, per row count.

For every linear shape of the bundled model (fused q/k/v, o, fused gate/up, down, the LM head)
and M rows of activations, the time of one call of:

- `fp32` / `bf16`: what Rill runs without quantization (model_loader.PackedLinear, oneDNN's
  prepacked weights; plain F.linear where oneDNN cannot pack);
- `int8 kernel`: torch's `_weight_int8pack_mm` on bfloat16 activations (engine_proc/model/quantization.py's
  decode path), fed bf16 (`bf16 in`) or fp32 casted to bf16 and back (`fp32 in`);
- `int8 dequant`: the int8 weight converted to fp32 or bf16 per call, F.linear, then the scales on
  the output (its prefill path);
- `int8 kernel fp32 scalar` (up to 8 rows): the same op fed float32 as it is, which torch runs in a
  scalar loop on x86: why the kernel path casts to bfloat16.

Calls are interleaved over rounds and the median round is reported (the machines are noisy);
compare within one run. Random weights of the model's shapes: timings do not depend on values.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.kernels.int8_linear import KERNEL_MAX_ROWS, Int8Linear
from rill.engine_proc.kernels.linear import PackedLinear

# (name, out_features N, in_features K) of SmolLM2-135M (hidden 576, 9 + 2 x 3 heads of 64, MLP 1536).
SHAPES = [("qkv_proj", 960, 576), ("o_proj", 576, 576), ("gate_up_proj", 3072, 576),
          ("down_proj", 576, 1536), ("lm_head", 49152, 576)]
ROWS = [1, 4, 8, 16, 24, 32, 64, 256]
SCALAR_MAX_ROWS = 8  # the scalar fp32 path takes seconds per call beyond this
VARIANTS = ["fp32", "bf16", "int8 kernel bf16 in", "int8 kernel fp32 in", "int8 dequant fp32",
            "int8 dequant bf16", "int8 kernel fp32 scalar"]


def float_linear(weight: torch.Tensor):
    """Rill's unquantized linear for this weight: oneDNN-packed where it can be."""
    try:
        packed = PackedLinear(weight, None)
        packed(torch.zeros(1, weight.shape[1], dtype=weight.dtype))
        return packed
    except RuntimeError:
        return lambda x: F.linear(x, weight)


def calls_for_shape(n: int, k: int, rows: int, gen: torch.Generator) -> dict[str, callable]:
    weight = torch.randn(n, k, generator=gen) * k**-0.5
    x32 = torch.randn(rows, k, generator=gen)
    x16 = x32.to(torch.bfloat16)
    fp32, bf16 = float_linear(weight), float_linear(weight.to(torch.bfloat16))
    int8 = Int8Linear(weight)
    scale32 = int8.scale.float()
    calls = {
        "fp32": lambda: fp32(x32),
        "bf16": lambda: bf16(x16),
        "int8 kernel bf16 in": lambda: int8.kernel_forward(x16),
        "int8 kernel fp32 in": lambda: int8.kernel_forward(x32),
        "int8 dequant fp32": lambda: int8.dequantized_forward(x32),
        "int8 dequant bf16": lambda: int8.dequantized_forward(x16),
    }
    if rows <= SCALAR_MAX_ROWS and k % 16 == 0:
        calls["int8 kernel fp32 scalar"] = lambda: torch.ops.aten._weight_int8pack_mm(x32, int8.weight_int8, scale32)
    return calls


def time_call(fn, budget_s: float) -> float:
    """Mean ms of one call, over as many calls as fit in `budget_s` (at least one)."""
    num_calls, start = 0, time.perf_counter()
    while True:
        fn()
        num_calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget_s:
            return elapsed / num_calls * 1000


def run(rows_list: list[int], rounds: int, budget_s: float) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    cells = []  # (shape name, rows, variant, fn)
    for name, n, k in SHAPES:
        for rows in rows_list:
            for variant, fn in calls_for_shape(n, k, rows, gen).items():
                fn()  # warm-up: oneDNN builds its primitive on the first call
                cells.append((name, rows, variant, fn))
    samples: dict[tuple, list[float]] = {(c[0], c[1], c[2]): [] for c in cells}
    with torch.inference_mode():
        for _ in range(rounds):
            for name, rows, variant, fn in cells:
                samples[(name, rows, variant)].append(time_call(fn, budget_s))
    results = []
    for name, n, k in SHAPES:
        for rows in rows_list:
            ms = {v: statistics.median(samples[(name, rows, v)]) for v in VARIANTS if (name, rows, v) in samples}
            results.append({"shape": name, "out_features": n, "in_features": k, "rows": rows, "ms": ms})
    return results


def ratio(ms: dict, num: str, den: str) -> str:
    return f"{ms[num] / ms[den]:.2f}x" if num in ms and den in ms else "–"


def markdown(report: dict) -> str:
    machine = report["machine"]
    lines = [
        "# int8 linears: one call's time by row count (ms, median of interleaved rounds)", "",
        f"`{report['command']}` on {report['date']}: {machine.get('cpu_model')} "
        f"({' '.join(machine.get('cpu_flags', []))}), {report['params']['torch_threads']} torch threads, "
        f"torch {machine.get('torch')}.", "",
        "fp32 / bf16: Rill's unquantized linears (oneDNN-packed). int8 kernel: `_weight_int8pack_mm` on bf16 "
        "activations (`fp32 in` adds the casts from and back to fp32). int8 dequant: the int8 weight converted to the "
        "activations' dtype per call, F.linear, then the scales on the output. fp32 scalar: the op fed fp32 as is (torch's scalar loop). Rill's int8 layer uses "
        "the kernel up to " + ", ".join(f"{rows} rows in {dtype}" for dtype, rows in
                                        report["params"]["kernel_max_rows"].items()) + " and the dequant path above.", "",
    ]
    for name, n, k in SHAPES:
        rows = [r for r in report["results"] if r["shape"] == name]
        cols = [v for v in VARIANTS if any(v in r["ms"] for r in rows)]
        lines += [f"## {name} ({n} x {k})", "",
                  table(["rows", *cols, "int8 kernel / bf16", "int8 kernel (fp32 in) / fp32",
                         "int8 dequant bf16 / kernel bf16"],
                        [[r["rows"], *(f"{r['ms'][c]:.3f}" if c in r["ms"] else "–" for c in cols),
                          ratio(r["ms"], "int8 kernel bf16 in", "bf16"), ratio(r["ms"], "int8 kernel fp32 in", "fp32"),
                          ratio(r["ms"], "int8 dequant bf16", "int8 kernel bf16 in")] for r in rows]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.quant_linears", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts M, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    ap.add_argument("--budget-ms", type=float, default=40.0, help="time spent per cell per round")
    ap.add_argument("--num-threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--quick", action="store_true", help="rows 1 and 32, 1 round, 2 ms a cell: checks that it runs")
    ap.add_argument("--out", type=Path, default=Path("bench/results/quant_linears-cpu.json"))
    args = ap.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    rows_list = [1, 32] if args.quick else [int(r) for r in args.rows.split(",")]
    rounds, budget_s = (1, 0.002) if args.quick else (args.rounds, args.budget_ms / 1000)
    results = run(rows_list, rounds, budget_s)
    report = {"benchmark": "quant_linears", **provenance("rill.bench.kernels.quant_linears", argv, None),
              "params": {"rows": rows_list, "rounds": rounds, "budget_ms": budget_s * 1000, "quick": args.quick,
                         "torch_threads": torch.get_num_threads(),
                         "kernel_max_rows": {str(k).removeprefix("torch."): v for k, v in KERNEL_MAX_ROWS.items()}},
              "results": results}
    text = markdown(report)
    save_results(args.out, report, text)
    print(text)
    return report


if __name__ == "__main__":
    main()
