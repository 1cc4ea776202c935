"""`rill serve --kv-cache-dtype` (vLLM's name) and its checks: what the KV cache stores."""
from __future__ import annotations

import argparse


def add_kv_cache_dtype_flag(engine) -> None:
    engine.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "int8"],
                        help="auto: K and V in the model's dtype; int8: each token's K and V per head as int8 "
                             "with a float32 scale, about 1.9x the blocks of bfloat16 in the same --kv-cache-memory "
                             "(native runner on the CPU, cpu attention backend; docs/quantization.md)")


def check_kv_cache_dtype_flag(args, parser: argparse.ArgumentParser) -> None:
    """Exit 2 naming the flag for a combination known here not to work (the engine refuses the
    ones only it can see: a GPU chosen by --device auto, a model on the transformers route)."""
    if args.kv_cache_dtype == "auto":
        return
    if args.device == "cuda":
        parser.error(f"--kv-cache-dtype {args.kv_cache_dtype} runs on the CPU only, not with --device cuda")
    if args.attention_backend in ("torch", "triton"):
        parser.error(f"--kv-cache-dtype {args.kv_cache_dtype} needs --attention-backend cpu (or auto), "
                     f"not {args.attention_backend}")
    if args.model_impl == "transformers":
        parser.error(f"--kv-cache-dtype {args.kv_cache_dtype} needs the native runner, not --model-impl transformers")
    if args.dtype == "float16":
        parser.error(f"--kv-cache-dtype {args.kv_cache_dtype} is served with --dtype bfloat16 or float32")
