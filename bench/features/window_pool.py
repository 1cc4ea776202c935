"""`python -m rill.bench.features.window_pool`: how much context the KV cache holds for a model with
sliding and global layers, now that its sliding layers keep only their window (window tables,
engine_proc/sched/window_tables.py), against one block table for every layer (before).

The engine's own sizing (num_blocks_for_memory with as many block tensors as global layers, the
block manager's num_tokens_alone) on the published shapes of Gemma 3 1B and 4B, Gemma 2 9B and GPT-OSS
20B (layers, KV heads, head size, window, which layers slide), at --kv-cache-memory 1 GiB (the
default) and 8 GiB: the longest request the cache holds on its own (scheduled in 2048-token chunks,
the default). Requests running together share the pool the same way: each holds its whole length
in the global layers' table and about its window in each window table.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import Gemma2Config, Gemma3TextConfig, GptOssConfig

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.attention.kv_layout import num_blocks_for_memory
from rill.engine_proc.model.hf_paged import interleaved_window
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.window_tables import layer_groups

BLOCK_SIZE = 16
MAX_NUM_BATCHED_TOKENS = 2048


def shapes() -> dict[str, object]:
    """Each model's config with its published attention shape (the rest does not size the cache)."""
    every_sixth = lambda n: ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]  # noqa: E731
    alternating = lambda n: ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]  # noqa: E731
    return {
        "gemma-3-1b": Gemma3TextConfig(num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                                       sliding_window=512, layer_types=every_sixth(26), max_position_embeddings=32768),
        "gemma-3-4b": Gemma3TextConfig(num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                                       sliding_window=1024, layer_types=every_sixth(34),
                                       max_position_embeddings=131072),
        "gemma-2-9b": Gemma2Config(num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                                   sliding_window=4096, layer_types=alternating(42), max_position_embeddings=8192),
        "gpt-oss-20b": GptOssConfig(num_hidden_layers=24, num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                                    sliding_window=128, layer_types=alternating(24), max_position_embeddings=131072),
    }


def capacity(config, memory: int) -> dict[str, int]:
    """Tokens the cache holds, with one table for every layer (before) and with window tables (now)."""
    before = num_blocks_for_memory(config, torch.bfloat16, BLOCK_SIZE, memory)
    window, layers = interleaved_window(config, config.max_position_embeddings)
    num_groups, _ = layer_groups(layers, config.num_hidden_layers)
    num_blocks = num_blocks_for_memory(config, torch.bfloat16, BLOCK_SIZE, memory, config.num_hidden_layers - len(layers))
    alone_before = BlockManager(before, BLOCK_SIZE).num_tokens_alone(MAX_NUM_BATCHED_TOKENS)
    alone_now = BlockManager(num_blocks, BLOCK_SIZE, window=(window, num_groups)).num_tokens_alone(
        MAX_NUM_BATCHED_TOKENS)
    return dict(window=window, window_groups=num_groups, one_request_before=alone_before, one_request_now=alone_now)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench/results/window_pool.json")
    args = parser.parse_args(argv)
    rows, results = [], []
    for name, config in shapes().items():
        for gib in (1, 8):
            figures = capacity(config, gib << 30)
            results.append(dict(model=name, kv_cache_gib=gib, **figures))
            rows.append([name, f"{gib} GiB", figures["window"], figures["window_groups"],
                         f"{figures['one_request_before']:,}", f"{figures['one_request_now']:,}",
                         f"**{figures['one_request_now'] / figures['one_request_before']:.2f}x**"])
    report = {**provenance("rill.bench.features.window_pool", argv, None), "results": results}
    md = ("# Context the KV cache holds with window tables for the sliding layers\n\n"
          f"`{report['command']}` ({report['date']}). Block size {BLOCK_SIZE}, bfloat16, "
          f"--max-num-batched-tokens {MAX_NUM_BATCHED_TOKENS}. Tokens of context of the longest request the "
          "cache holds alone.\n\n"
          + table(["model", "--kv-cache-memory", "window", "window tables", "before (one table)", "now (window tables)",
                   "now / before"], rows))
    save_results(Path(args.out), report, md)
    print(md)


if __name__ == "__main__":
    main()
