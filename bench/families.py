"""`python -m rill.bench.families`: each model family's served throughput against a llama of the same shape.

Every family is a random-weight model at one shape (hidden 256, 4 layers, 4 heads, 2 KV heads,
head_dim 64, the bundled tokenizer and its vocabulary; 8 experts, top-2, for the MoE families; a
64-token window where the family has one), served by `rill serve --model DIR --load-format dummy`
at its defaults and driven at concurrency 16 with 128-token random prompts and 64 forced output
tokens. A llama of the same shape (native) is served throughout and measured before and after each
of a family's rounds: the median over the rounds of the ratio to the mean of those two runs is issue
32's target, at least 0.6x natively, 0.5x on the transformers route.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from rill.bench.__main__ import build_parser
from rill.bench.serving.config import config_from_args
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.serve import run_benchmark
from rill.bench.serving.servers import rill_server
from rill.bench.serving.tiny_model import TOKENIZER_FILE_NAMES

SHAPE = dict(vocab_size=49152, hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
             pad_token_id=None)  # fmt: skip
WINDOW = 64
ALTERNATING = ["sliding_attention", "full_attention"] * 2
TARGETS = {"native": 0.6, "transformers": 0.5}


def family_configs() -> dict:
    """name -> a transformers config at SHAPE (imported here: transformers is slow to import)."""
    import transformers as t

    experts = dict(num_experts_per_tok=2)
    return {
        "llama": t.LlamaConfig(**SHAPE),
        "qwen3": t.Qwen3Config(**SHAPE),
        "granite": t.GraniteConfig(**SHAPE, embedding_multiplier=12.0, residual_multiplier=0.22,
                                   attention_multiplier=0.015625, logits_scaling=8.0),
        "smollm3": t.SmolLM3Config(**SHAPE, no_rope_layer_interval=4),
        "phi3": t.Phi3Config(**SHAPE),
        # Phi-4-mini's 3/4 rotary with LongRoPE: on the transformers route (the long factors here)
        "phi4-mini": t.Phi3Config(**SHAPE, partial_rotary_factor=0.75, original_max_position_embeddings=1024,
                                  rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                   "original_max_position_embeddings": 1024,
                                                   "short_factor": [1.0 + 0.05 * i for i in range(24)],
                                                   "long_factor": [1.0 + 0.3 * i for i in range(24)]}),
        "olmo2": t.Olmo2Config(**SHAPE),
        "gemma3_text": t.Gemma3TextConfig(**SHAPE, sliding_window=WINDOW,
                                          layer_types=["sliding_attention"] * 3 + ["full_attention"]),
        # Gemma 4: global layers of twice the head width, per-layer input embeddings
        "gemma4": t.Gemma4TextConfig(**SHAPE, global_head_dim=128, sliding_window=WINDOW,
                                     layer_types=["sliding_attention"] * 3 + ["full_attention"],
                                     hidden_size_per_layer_input=64, vocab_size_per_layer_input=SHAPE["vocab_size"]),
        "gemma2": t.Gemma2Config(**SHAPE, sliding_window=WINDOW, layer_types=ALTERNATING),
        # Qwen3.5: three Gated DeltaNet layers (a state per sequence, run one sequence at a time) to a full one
        "qwen3_5": t.Qwen3_5TextConfig(**SHAPE, layer_types=["linear_attention"] * 3 + ["full_attention"],
                                       linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=64,
                                       linear_value_head_dim=64),
        # Granite 4's hybrid: three Mamba 2 layers (8 heads of 64, states of 64) to an attention layer without RoPE,
        # experts and a shared MLP each as wide as Qwen3-MoE's here (Granite 4's real experts are a third of its
        # hidden size, its shared MLP two thirds)
        "granitemoehybrid": t.GraniteMoeHybridConfig(**{**SHAPE, "intermediate_size": 256}, **experts,
                                                     num_local_experts=8,
                                                     layer_types=["linear_attention"] * 3 + ["full_attention"],
                                                     shared_intermediate_size=256, position_embedding_type="nope",
                                                     mamba_n_heads=8, mamba_d_head=64, mamba_d_state=64,
                                                     mamba_chunk_size=64),
        "mistral-window": t.MistralConfig(**SHAPE, sliding_window=WINDOW),
        "qwen3_moe": t.Qwen3MoeConfig(**SHAPE, **experts, num_experts=8, moe_intermediate_size=256),
        "mixtral": t.MixtralConfig(**SHAPE, **experts, num_local_experts=8),
        "gpt_oss": t.GptOssConfig(**{**SHAPE, "intermediate_size": 256}, **experts, num_local_experts=8,
                                  sliding_window=WINDOW, layer_types=ALTERNATING,
                                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        # DeepSeek V3's multi-head latent attention (a 128-wide latent, keys of 32 + 32 rotary, values of 64; its
        # rotary modules' head_dim the rotary part's), a dense first layer, then routed and shared experts
        "deepseek_v3": t.DeepseekV3Config(**{**SHAPE, "num_key_value_heads": 4, "head_dim": 32}, **experts, n_routed_experts=8,
                                          moe_intermediate_size=256, n_shared_experts=1, first_k_dense_replace=1,
                                          n_group=1, topk_group=1, q_lora_rank=None, kv_lora_rank=128,
                                          qk_nope_head_dim=32, qk_rope_head_dim=32, v_head_dim=64),
    }


def write_model_dir(config, out: Path) -> Path:
    """config.json beside the bundled model's tokenizer files: a directory `--load-format dummy` serves."""
    from rill.engine_proc.model.bundled import ensure_bundled_model

    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    source = ensure_bundled_model()
    for name in TOKENIZER_FILE_NAMES:
        if (source / name).is_file() and name != "generation_config.json":
            shutil.copyfile(source / name, out / name)
    return out


def serve(model_dir: Path, log_path: Path):
    return rill_server("--model", str(model_dir), "--load-format", "dummy", "--served-model-name", "m",
                       "--max-model-len", "2048", "--log-level", "info", log_path=log_path)


def measure(srv, args) -> float:
    """Output tok/s of one run of the load against `srv`."""
    bench_args = build_parser().parse_args([
        "serve", "--base-url", srv.base_url, "--model", "m", "--dataset-name", "random",
        "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
        "--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency),
        "--num-warmups", str(args.concurrency), "--disable-tqdm"])
    result = asyncio.run(run_benchmark(config_from_args(bench_args)))
    if result["completed"] != args.num_prompts:
        raise SystemExit(f"{result['completed']} of {args.num_prompts} requests completed against {srv.base_url}")
    return result["output_throughput"]


def runner_of(log_path: Path) -> str:
    return "native" if "native runner" in log_path.read_text(errors="replace") else "transformers"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.families", description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=None, help="comma-separated (default: all but llama)")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results/families-cpu.json"))
    args = ap.parse_args(argv)
    configs = family_configs()
    names = [n for n in (args.families.split(",") if args.families else configs) if n != "llama"]
    rows = {}
    with tempfile.TemporaryDirectory(prefix="rill-families-") as scratch:
        scratch = Path(scratch)
        # The llama's server stays up (idle, it costs nothing) while a family's is measured; each of
        # a family's runs is sandwiched between two of the llama's, whose mean is its baseline, and
        # the median of its rounds' ratios is its figure: this shared 2-core machine's throughput
        # drifts by a third from one minute to the next (seen: the llama's runs from 1,520 to 2,429).
        with serve(write_model_dir(configs["llama"], scratch / "llama"), scratch / "llama.log") as llama_srv:
            measure(llama_srv, args)  # unmeasured, as each family's first run below
            llama_runs = [measure(llama_srv, args)]
            for name in names:
                log_path = scratch / f"{name}.log"
                ratios, runs = [], []
                with serve(write_model_dir(configs[name], scratch / name), log_path) as srv:
                    measure(srv, args)  # unmeasured: a fresh server's first run is slower (its cache's pages)
                    for _ in range(args.rounds):  # llama, family, llama, family, ..., llama
                        runs.append(measure(srv, args))
                        llama_runs.append(measure(llama_srv, args))
                        ratios.append(runs[-1] / ((llama_runs[-2] + llama_runs[-1]) / 2))
                ratio = statistics.median(ratios)
                rows[name] = {"runner": runner_of(log_path), "output_throughput": statistics.median(runs),
                              "runs": runs, "ratios": ratios, "ratio": ratio, "target": TARGETS[runner_of(log_path)]}
                rows[name]["pass"] = ratio >= rows[name]["target"]
                print(name, json.dumps(rows[name]), flush=True)
    report = {"benchmark": "families", **provenance("rill.bench.families", argv, None),
              "params": vars(args) | {"out": str(args.out)}, "llama_runs": llama_runs, "families": rows}
    lines = [f"# Model families: output tok/s at concurrency {args.concurrency}, against a llama of the same shape", "",
             f"`{report['command']}` on {report['date']}, CPU: {report['machine'].get('cpu_model', '?')} "
             f"({', '.join(report['machine'].get('cpu_flags', [])) or 'flags unknown'}).", "",
             table(["family", "runner", "output tok/s (median)", "/ llama, each round", "/ llama (median)", "target"],
                   [[n, r["runner"], f"{r['output_throughput']:.0f}", ", ".join(f"{x:.2f}" for x in r["ratios"]),
                     f"**{r['ratio']:.2f}x**", f"{r['target']}x {'PASS' if r['pass'] else 'FAIL'}"]
                    for n, r in rows.items()]), "",
             f"The llama's runs, in order: {', '.join(f'{x:.0f}' for x in llama_runs)} tok/s.", ""]
    save_results(args.out, report, "\n".join(lines))
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
