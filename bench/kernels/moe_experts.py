"""`python -m rill.bench.kernels.moe_experts`: a mixture-of-experts layer's experts, transformers'
grouped GEMM (`torch._grouped_mm`) against Rill's (engine_proc/model/hf_experts.py: each expert's
projections packed in the native linear kernels, one GEMM per expert over its tokens sorted by expert,
dispatched from Python, or for SiLU-gated experts and GPT-OSS's all in the C++ operator
rill_cpu::moe_experts). `--int8`: Rill's experts as --quantization int8 packs them (rill_cpu::moe_experts_int8
against the Python loop over the same int8 layers), transformers' in bfloat16 as before.

Both on the same module of a random-weight model at bench.families' shape (hidden 256, 8 experts,
top-2), bfloat16, at a decode step's 16 tokens and a prompt step's 512, the same routing for both.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results

FAMILIES = ("qwen3_moe", "mixtral", "gpt_oss")


def experts_of(name: str, dtype: torch.dtype, int8: bool = False):
    """(transformers' experts module, Rill's packed copy of it) for a family of bench.families."""
    import copy

    from transformers import AutoModelForCausalLM

    from rill.bench.families import family_configs
    from rill.engine_proc.kernels.linear import packed_linear
    from rill.engine_proc.model.hf_experts import pack_experts

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(family_configs()[name], dtype=dtype).eval()
    layer = next(m for m in model.modules() if hasattr(m, "is_concatenated"))
    theirs = copy.deepcopy(layer)
    theirs.config = copy.copy(layer.config)
    theirs.config._experts_implementation = "grouped_mm"
    wrapper = torch.nn.Module()
    wrapper.experts = layer
    if int8:
        from rill.engine_proc.kernels.int8_linear import Int8Linear

        pack_experts(wrapper, lambda weight, bias, proj: Int8Linear(weight, bias))
    else:
        pack_experts(wrapper, lambda weight, bias, proj: packed_linear(weight, bias, proj, False))
    return theirs, layer


def time_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.moe_experts", description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="qwen3_moe only, 5 repeats: checks that it runs")
    ap.add_argument("--int8", action="store_true", help="Rill's experts in int8 (--quantization int8)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/moe_experts-cpu.json"))
    args = ap.parse_args(argv)
    from rill.engine_proc.model.hf_experts import _experts_loop

    families, repeats = (("qwen3_moe",), 5) if args.quick else (FAMILIES, args.repeats)
    rows = []
    with torch.inference_mode():
        for name in families:
            theirs, ours = experts_of(name, torch.bfloat16, args.int8)
            for num_tokens in (16, 512):
                generator = torch.Generator().manual_seed(num_tokens)
                x = torch.randn(num_tokens, 256, generator=generator, dtype=torch.float32).to(torch.bfloat16)
                index = torch.stack([torch.randperm(8, generator=generator)[:2] for _ in range(num_tokens)])
                weights = torch.rand(num_tokens, 2, generator=generator).to(torch.bfloat16)
                want, got = theirs(x, index, weights), ours(x, index, weights)
                grouped = time_ms(lambda: theirs(x, index, weights), repeats)
                loop = time_ms(lambda: _experts_loop(ours, x, index, weights), repeats)
                rill = time_ms(lambda: ours(x, index, weights), repeats)
                rows.append({"family": name, "tokens": num_tokens, "grouped_mm_ms": grouped, "loop_ms": loop,
                             "rill_ms": rill, "operator": ours.rill_fused is not None, "speedup": grouped / rill,
                             "max_abs_diff": float((want - got).abs().max()), "max_abs": float(want.abs().max())})
    report = {"benchmark": "moe_experts", **provenance("rill.bench.kernels.moe_experts", argv, None),
              "params": {"repeats": repeats, "dtype": "bfloat16", "int8": args.int8}, "rows": rows}
    lines = ["# MoE experts: transformers' grouped GEMM against Rill's packed experts", "",
             f"`{report['command']}` on {report['date']}, CPU: {report['machine'].get('cpu_model', '?')} "
             f"({', '.join(report['machine'].get('cpu_flags', []))}), bfloat16, one layer's experts"
             + (", Rill's in int8 (the difference is mostly int8's)." if args.int8 else "."), "",
             table(["family", "tokens", "grouped_mm ms", "Rill's Python loop ms", "Rill ms (what the route runs)",
                    "speed-up", "max |diff| / max |out|"],
                   [[r["family"], r["tokens"], f"{r['grouped_mm_ms']:.3f}", f"{r['loop_ms']:.3f}",
                     f"{r['rill_ms']:.3f}" + (" (C++ operator)" if r["operator"] else " (the loop)"),
                     f"**{r['speedup']:.2f}x**", f"{r['max_abs_diff']:.2g} / {r['max_abs']:.2g}"] for r in rows]), ""]
    save_results(args.out, report, "\n".join(lines))
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
