"""`python -m rill.bench.kernels.linear_kernels`: Rill's AMX linear against oneDNN's, per layer and row count.

For every linear shape of the bundled model (or of --shape's config) in bfloat16 and M rows of activations, the time of one
call of `amx` (loader.AmxLinear: csrc/amx_linear.cpp over 64-column panels) and `onednn`
(loader.PackedLinear: oneDNN's inner product over its own prepacked weight). Weights are cold as
in a real step, where a layer's weights have left the caches since it last ran: each timed call
goes to the next of COPIES copies of the weight, whose sum is larger than the caches. Calls are
interleaved over rounds; the median round is reported (the machines are noisy), and the result
decides which layers kernels/linear.packed_linear gives the AMX kernel by default. gate_up_proj also
runs as the MLP uses it, followed by SiLU(gate) * up (`gate_up_proj + silu_mul`): in the AMX
kernel's epilogue against oneDNN's layer and the separate silu_mul.

Where Rill's AVX-512 BF16 micro-kernel serves `amx` (csrc/bf16_dot_panel.h: a CPU without AMX, or
RILL_AMX_TILES=0), a `brgemm` column times the same layers on ATen's brgemm (amx_linear_kernel("brgemm"),
as RILL_BF16_DOT=0 would) in the same rounds. On an AMX CPU, `RILL_AMX_TILES=0 ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16` gives all three
columns AVX-512 BF16 alone, as on a Zen 4.

Needs a CPU with AMX-BF16 or AVX-512 BF16 (else it says so and exits).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from rill.bench.kernels.quant_linears import SHAPES
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.linear import AmxLinear, PackedLinear

ROWS = [1, 8, 32, 128, 512]
ENV = ("RILL_AMX_TILES", "RILL_BF16_DOT", "ONEDNN_MAX_CPU_ISA", "THP_MEM_ALLOC_ENABLE")  # recorded where set
COPIES = 24  # the bundled model's gate_up x 24 is 85 MB


def kernel_choice() -> dict:
    """Which micro-kernel AmxLinear runs on here, and the environment variables that chose it (where set)."""
    kernel = torch.ops.rill_cpu.amx_linear_kernel() if extension.available() else None
    return {"kernel": kernel, "env": {name: os.environ[name] for name in ENV if name in os.environ}}


def layers_for_shape(n: int, k: int, gen: torch.Generator, brgemm: bool) -> dict[str, list]:
    copies = max(2, COPIES * 3072 * 576 // (n * k))  # the LM head is big enough with two
    weights = [(torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16) for _ in range(copies)]
    amx = [AmxLinear(w, None) for w in weights]
    return {"amx": amx, **({"brgemm": amx} if brgemm else {}), "onednn": [PackedLinear(w, None) for w in weights]}


def time_kernel(layers: list, x: torch.Tensor, call) -> float:
    """Mean ms of one call, each call on the next copy of the weight."""
    for layer in layers[:2]:
        call(layer, x)  # oneDNN builds its primitive on the first call
    start = time.perf_counter()
    for layer in layers:
        call(layer, x)
    return (time.perf_counter() - start) / len(layers) * 1000


LAYER_CALLS = {"amx": lambda layer, x: layer(x), "onednn": lambda layer, x: layer(x)}
# What the MLP runs: gate_up_proj then SiLU(gate) * up, which the AMX kernel does in its epilogue
# (AmxLinear.silu_mul) and oneDNN's layer leaves to the separate rill_cpu::silu_mul.
SILU_CALLS = {"amx": lambda layer, x: layer.silu_mul(x), "onednn": lambda layer, x: torch.ops.rill_cpu.silu_mul(layer(x))}


def measure(layers: dict, x: torch.Tensor, rounds: int, calls: dict) -> dict:
    samples = {kind: [] for kind in layers}
    for r in range(rounds):
        for kind in (list(layers) if r % 2 else list(layers)[::-1]):
            if "brgemm" in layers:  # the same AmxLinear layers, on ATen's brgemm for this column
                torch.ops.rill_cpu.amx_linear_kernel("brgemm" if kind == "brgemm" else "avx512_bf16")
            samples[kind].append(time_kernel(layers[kind], x, calls["amx" if kind == "brgemm" else kind]))
    return {kind: statistics.median(v) for kind, v in samples.items()}


def shapes_of(config_dir: Path) -> list[tuple[str, int, int]]:
    """A decoder's linear shapes (out, in) from its config.json (bench/models/*): Llama-like layers."""
    c = json.loads((config_dir / "config.json").read_text())
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim") or hidden // heads
    kv = c.get("num_key_value_heads", heads) * head_dim
    return [("qkv_proj", heads * head_dim + 2 * kv, hidden), ("o_proj", hidden, heads * head_dim),
            ("gate_up_proj", 2 * c["intermediate_size"], hidden), ("down_proj", hidden, c["intermediate_size"]),
            ("lm_head", c["vocab_size"], hidden)]


def run(rows_list: list[int], rounds: int, brgemm: bool, shapes: list[tuple[str, int, int]] = SHAPES) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    results = []
    with torch.inference_mode():
        for name, n, k in shapes:
            layers = layers_for_shape(n, k, gen, brgemm)
            for rows in rows_list:
                if name == "lm_head" and rows > 32:
                    continue  # the head runs on the sampled rows only
                x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
                results.append({"shape": name, "out_features": n, "in_features": k, "rows": rows,
                                "ms": measure(layers, x, rounds, LAYER_CALLS)})
                if name == "gate_up_proj":
                    results.append({"shape": "gate_up_proj + silu_mul", "out_features": n, "in_features": k,
                                    "rows": rows, "ms": measure(layers, x, rounds, SILU_CALLS)})
            del layers
    return results


def markdown(report: dict) -> str:
    machine = report["machine"]
    brgemm = report["params"]["kernel"] == "avx512_bf16"
    rows = [[r["shape"], f"{r['out_features']} x {r['in_features']}", r["rows"], f"{r['ms']['amx']:.3f}",
             *([f"{r['ms']['brgemm']:.3f}", f"{r['ms']['amx'] / r['ms']['brgemm']:.2f}x"] if brgemm else []),
             f"{r['ms']['onednn']:.3f}", f"{r['ms']['amx'] / r['ms']['onednn']:.2f}x"] for r in report["results"]]
    return "\n".join([
        "# bfloat16 linears: Rill's AMX kernel against oneDNN's, one call (ms, cold weights)", "",
        f"- command: `{report['command']}`", f"- date: {report['date']}",
        f"- machine: {machine.get('cpu_model')} ({' '.join(machine.get('cpu_flags', []))}), "
        f"{report['params']['torch_threads']} torch threads, torch {machine.get('torch')}",
        f"- {report['params']['rounds']} interleaved rounds, medians; `amx` ran Rill's `{report['params']['kernel']}` "
        f"micro-kernel; environment: {report['params']['env'] or 'none set'}", "",
        table(["layer", "out x in", "rows", "amx ms", *(["brgemm ms", "amx / brgemm"] if brgemm else []),
               "onednn ms", "amx / onednn"], rows), "",
        __doc__.split("\n\n", 1)[1],
    ])


def main(argv: list[str] | None = None) -> dict | None:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.linear_kernels", description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="row counts M, comma-separated")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    ap.add_argument("--quick", action="store_true", help="rows 1 and 32, 1 round: checks that it runs")
    ap.add_argument("--shape", type=Path, help="a config directory (bench/models/qwen2.5-1.5b): its layers' shapes "
                    "instead of the bundled model's")
    ap.add_argument("--out", type=Path, default=Path("bench/results/linear_kernels-cpu.json"))
    args = ap.parse_args(argv)
    if not (extension.available() and torch.ops.rill_cpu.amx_linear_supported()):
        print("this CPU has neither AMX-BF16 nor AVX-512 BF16 (or the CPU kernels could not be built): nothing to compare")
        return None
    rows_list = [1, 32] if args.quick else [int(r) for r in args.rows.split(",")]
    rounds = 1 if args.quick else args.rounds
    choice = kernel_choice()
    report = {"benchmark": "linear_kernels", **provenance("rill.bench.kernels.linear_kernels", argv, None),
              "params": {"rows": rows_list, "rounds": rounds, "torch_threads": torch.get_num_threads(), **choice,
                         "shape": args.shape and str(args.shape)},
              "results": run(rows_list, rounds, choice["kernel"] == "avx512_bf16",
                             shapes_of(args.shape) if args.shape else SHAPES)}
    text = markdown(report)
    save_results(args.out, report, text)
    print(text)
    return report


if __name__ == "__main__":
    main()
