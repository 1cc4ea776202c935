"""`python -m rill.bench.kernels.int4_linears`: 4-bit linears against int8 and bfloat16 ones, per row count,
at the bundled model's shapes and at Qwen2.5-1.5B's, with the memory-bandwidth floor.

For each linear shape of a model (fused q/k/v, o, fused gate/up, down, the LM head), summed over the shapes,
the time of one call of each of Rill's linears on M rows of bfloat16 activations:
- `bf16`: the unquantized one (oneDNN's prepacked weight, PackedLinear);
- `int8`: Int8Linear (csrc/int8_gemv.cpp, and its converted GEMM above GEMV_MAX_ROWS rows);
- `int4`: Int4Linear (csrc/int4_gemv.cpp; above its GEMV rows csrc/quant_panels.cpp where the CPU has AVX-512 BF16,
  on AMX's tiles where they serve: csrc/quant_tiles.h);
- where the tiles serve, `int8 brgemm` and `int4 brgemm`: the same layers with brgemm over the panels instead
  (quant_panels_kernel("brgemm"), the GEMV's rows left as they are), in the same rounds;
- with `--schemes`, int4's other layouts: `int4-sym` (no offsets, 4.5 bits a weight, GGUF's Q4_0), `int4-g128` (a
  scale and offset per 128 weights, 4.25 bits) and `int4-sym-g128` (4.125 bits), against `int4` (5 bits);
A decode row reads every weight once, so at one row each has a floor: its weight bytes over the memory
bandwidth, which a large copy measures in the same run (bytes read plus written per second). The
ratio `int4 / floor` says how close the kernel gets. Each layer has its own copy of the weights, so a step streams
them from memory as a model's does. Steps are interleaved over rounds and the median round is reported; random
weights of the model's shapes (timings do not depend on values).
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from pathlib import Path

import torch

from rill.bench.kernels.quant_linears import float_linear, time_call
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.int4_linear import Int4Linear
from rill.engine_proc.kernels.int8_linear import Int8Linear

# (name, out_features N, in_features K) per layer, and the head.
MODELS = {
    "smollm2-135m": (30, [("qkv_proj", 960, 576), ("o_proj", 576, 576), ("gate_up_proj", 3072, 576),
                          ("down_proj", 576, 1536)], ("lm_head", 49152, 576)),
    "qwen2.5-1.5b": (28, [("qkv_proj", 2048, 1536), ("o_proj", 1536, 1536), ("gate_up_proj", 17920, 1536),
                          ("down_proj", 1536, 8960)], ("lm_head", 151936, 1536)),
}
VARIANTS = ["bf16", "int8", "int4"]
SCHEMES = {"int4-sym": (32, True), "int4-g128": (128, False), "int4-sym-g128": (128, True)}  # (group size, symmetric)
ROWS = [1, 4, 8, 16, 32, 64, 256]


def copy_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Bytes read plus written per second by torch's copy of a large buffer (the best of 5)."""
    src = torch.ones(num_bytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best


def weight_bytes(layer) -> int:
    return sum(b.numel() * b.element_size() for b in (*layer.buffers(), *layer.parameters()))


def variants(schemes: list[str]) -> list[str]:
    """VARIANTS, and the quantized ones on brgemm's panels where AMX's tiles serve them by default; then `schemes`."""
    tiles = extension.available() and torch.ops.rill_cpu.quant_panels_kernel() == "amx_tiles"
    return VARIANTS + (["int8 brgemm", "int4 brgemm"] if tiles else []) + schemes


def run(model: str, rows_list: list[int], rounds: int, budget_s: float, schemes: list[str] = ()) -> dict:
    """A decode step's linears, as the model reads them: every layer's own copy of each shape (so the weights
    stream from memory, as in a real step, not from a cache one layer's weights fit in), then the head."""
    num_layers, shapes, head = MODELS[model]
    gen = torch.Generator().manual_seed(0)
    steps: dict[str, list] = {variant: [] for variant in (*VARIANTS, *schemes)}  # (layer, in_features) in step order
    for name, n, k in [*shapes, head]:
        weight = (torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16)
        copies = 1 if name == head[0] else num_layers
        steps["bf16"] += [(float_linear(weight), k) for _ in range(copies)]  # oneDNN's packed weight: no deepcopy
        layers = [("int8", Int8Linear(weight)), ("int4", Int4Linear(weight))]
        layers += [(v, Int4Linear(weight, None, None, *SCHEMES[v])) for v in schemes]  # the head too, as `int4`'s
        for variant, layer in layers:
            steps[variant] += [(layer, k), *((copy.deepcopy(layer), k) for _ in range(copies - 1))]
    names = variants(list(schemes))
    for variant in names:
        if variant.endswith(" brgemm"):
            steps[variant] = steps[variant.split()[0]]
    samples: dict[tuple, list[float]] = {}
    with torch.inference_mode():
        inputs = {(rows, k): torch.randn(rows, k, generator=gen).to(torch.bfloat16)
                  for rows in rows_list for _, _, k in [*shapes, head]}

        def step(variant: str, rows: int) -> None:
            for layer, k in steps[variant]:
                layer(inputs[rows, k])

        for _ in range(rounds):
            for variant in names:
                if variant.endswith(" brgemm"):
                    torch.ops.rill_cpu.quant_panels_kernel("brgemm")
                for rows in rows_list:
                    step(variant, rows)
                    samples.setdefault((variant, rows), []).append(time_call(lambda: step(variant, rows), budget_s))
                if variant.endswith(" brgemm"):
                    torch.ops.rill_cpu.quant_panels_kernel("amx_tiles")
    step_bytes = {variant: sum(n * k * 2 for _, n, k in shapes) * num_layers + head[1] * head[2] * 2
                  if variant == "bf16" else sum(weight_bytes(layer) for layer, _ in steps[variant]) for variant in names}
    return {"model": model, "num_layers": num_layers,
            "step_ms": {f"{variant} {rows}": round(statistics.median(v), 4) for (variant, rows), v in samples.items()},
            "weight_bytes": step_bytes}


def markdown(report: dict) -> str:
    machine, bandwidth = report["machine"], report["copy_bandwidth_gb_s"]
    lines = ["# 4-bit linears against int8 and bfloat16: a decode step's linears (ms, median of interleaved rounds)", "",
             f"`{report['command']}` on {report['date']}: {machine.get('cpu_model')} "
             f"({' '.join(machine.get('cpu_flags', []))}), {report['params']['torch_threads']} torch threads, "
             f"torch {machine.get('torch')}. A copy moved {bandwidth:.1f} GB/s (read + written).", "",
             "Each figure: every linear of the model's layers on M rows of bfloat16 activations, times the layers, "
             "plus the head once. floor: the weight bytes read once at the copy's bandwidth.", ""]
    for result in report["results"]:
        rows_list, names = report["params"]["rows"], list(result["weight_bytes"])
        floors = {v: result["weight_bytes"][v] / (bandwidth * 1e9) * 1e3 for v in names}
        brgemm = "int4 brgemm" in names
        lines += [f"## {result['model']} ({result['num_layers']} layers)", "",
                  table(["variant", "weights (MB)", "floor (ms)", *[f"M={r}" for r in rows_list]],
                        [[v, f"{result['weight_bytes'][v] / 1e6:.0f}", f"{floors[v]:.2f}",
                          *[f"{result['step_ms'][f'{v} {r}']:.2f}" for r in rows_list]] for v in names]), "",
                  table(["rows", "int4 / bf16", "int4 / int8", "int4 / its floor",
                         *(["int4 / int4 brgemm", "int8 / int8 brgemm"] if brgemm else [])],
                        [[r, f"{result['step_ms'][f'int4 {r}'] / result['step_ms'][f'bf16 {r}']:.2f}x",
                          f"{result['step_ms'][f'int4 {r}'] / result['step_ms'][f'int8 {r}']:.2f}x",
                          f"{result['step_ms'][f'int4 {r}'] / floors['int4']:.2f}x" if r == 1 else "–",
                          *([f"{result['step_ms'][f'{q} {r}'] / result['step_ms'][f'{q} brgemm {r}']:.2f}x"
                             for q in ("int4", "int8")] if brgemm else [])]
                         for r in rows_list]), ""]
        schemes = [v for v in names if v in SCHEMES]
        if schemes:
            lines += [table(["rows", *[f"{v} / int4" for v in schemes], *[f"{v} / its floor" for v in schemes]],
                            [[r, *[f"{result['step_ms'][f'{v} {r}'] / result['step_ms'][f'int4 {r}']:.2f}x"
                                   for v in schemes],
                              *[f"{result['step_ms'][f'{v} {r}'] / floors[v]:.2f}x" if r == 1 else "–"
                                for v in schemes]] for r in rows_list]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.int4_linears", description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="shapes to run, comma-separated: " + ", ".join(MODELS))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts M, comma-separated")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median reported)")
    ap.add_argument("--budget-ms", type=float, default=30.0, help="time spent per cell per round")
    ap.add_argument("--schemes", default="", help="int4's other layouts too, comma-separated: " + ", ".join(SCHEMES))
    ap.add_argument("--quick", action="store_true", help="the small model, rows 1 and 32, 1 round: checks that it runs")
    ap.add_argument("--out", type=Path, default=Path("bench/results/int4_linears-cpu.json"))
    args = ap.parse_args(argv)
    models = ["smollm2-135m"] if args.quick else args.models.split(",")
    rows_list = [1, 32] if args.quick else [int(r) for r in args.rows.split(",")]
    rounds, budget_s = (1, 0.002) if args.quick else (args.rounds, args.budget_ms / 1000)
    bandwidth = copy_bandwidth(1 << 26 if args.quick else 1 << 30) / 1e9
    schemes = [v for v in args.schemes.split(",") if v]
    if unknown := set(schemes) - set(SCHEMES):
        ap.error(f"--schemes: unknown {sorted(unknown)}; expected some of {', '.join(SCHEMES)}")
    results = [run(model, rows_list, rounds, budget_s, schemes) for model in models]
    report = {"benchmark": "int4_linears", **provenance("rill.bench.kernels.int4_linears", argv, None),
              "params": {"rows": rows_list, "rounds": rounds, "budget_ms": budget_s * 1000, "quick": args.quick,
                         "schemes": schemes,
                         "torch_threads": torch.get_num_threads()},
              "copy_bandwidth_gb_s": bandwidth, "results": results}
    text = markdown(report)
    save_results(args.out, report, text)
    print(text)
    return report


if __name__ == "__main__":
    main()
