"""The transformers side of bench/peers: batched `generate`, one decode step and one prefill, in-process."""
from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from rill.bench.kernels.engine_step import WARMUP_STEPS, HFDecode, HFPrefill


def load_model(model_dir: Path, dtype: torch.dtype) -> torch.nn.Module:
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()  # generate's notes on its config are noise in a benchmark's output
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def left_pad(prompt_ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask, left-padded to the longest prompt as generate wants for decoder-only models."""
    width = max(map(len, prompt_ids))
    ids = torch.full((len(prompt_ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), width), dtype=torch.long)
    for row, p in enumerate(prompt_ids):
        ids[row, width - len(p):] = torch.tensor(p)
        mask[row, width - len(p):] = 1
    return ids, mask


@torch.inference_mode()
def generate_throughput(model, prompt_ids: list[list[int]], output_len: int) -> dict:
    """Every prompt in ONE `generate` call, greedy, exactly output_len new tokens each; tokens/s over its wall time."""
    pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else model.config.eos_token_id
    ids, mask = left_pad(prompt_ids, pad_id)
    start_s = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=output_len,
                         min_new_tokens=output_len, pad_token_id=pad_id)
    wall_s = time.perf_counter() - start_s
    num_new = out.shape[1] - ids.shape[1]
    assert num_new == output_len, f"generate made {num_new} tokens a row, not {output_len}"
    num_output_tokens = len(prompt_ids) * num_new
    return {"wall_s": wall_s, "num_output_tokens": num_output_tokens, "output_throughput": num_output_tokens / wall_s}


def decode_steps_ms(model, context_len: int, num_steps: int) -> list[float]:
    """Times of one batch-1 decode step with a DynamicCache holding context_len - 1 tokens (warm-up dropped)."""
    decode = HFDecode(model, [context_len])
    for _ in range(WARMUP_STEPS):
        decode.step()
    decode.reset()
    return [1e3 * decode.step() for _ in range(num_steps)]


def prefill_ms(model, prompts_ids: list[list[int]]) -> list[float]:
    """Per prompt, the time of one forward over all of it with logits_to_keep=1, as generate's first step.

    The first prompt runs once untimed before, so a cold start is not counted.
    """
    HFPrefill(model, prompts_ids[0]).step()
    return [1e3 * HFPrefill(model, ids).step() for ids in prompts_ids]
