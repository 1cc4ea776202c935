"""Runners for tests and benches, built the old keyword way: `make_runner(model_dir, num_kv_blocks=..., eos_token_ids=...)`."""
from __future__ import annotations

import torch

from rill.ipc.config import ModelConfig


def make_runner(model_dir, *, num_kv_blocks: int, eos_token_ids: list[int], dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu", compile_decode: bool = False, embeddings: bool = False,
                tp_rank: int = 0, tp_size: int = 1, runner_class=None, max_model_len: int | None = None,
                **model_fields):
    """A native ModelRunner (or `runner_class`), eager unless `compile_decode`; `model_fields`: the rest
    of ModelConfig (block_size, attention_backend, batch_invariant, quantization, ...)."""
    model = ModelConfig(model_dir=str(model_dir), enforce_eager=not compile_decode, enable_embeddings=embeddings,
                        **model_fields)
    computed = dict(dtype=dtype, device=device, num_kv_blocks=num_kv_blocks, eos_token_ids=eos_token_ids)
    if max_model_len is not None:  # the server's --max-model-len
        computed["max_model_len"] = max_model_len
    if runner_class is not None:
        return runner_class(model, **computed)
    from rill.engine_proc.model.runner import ModelRunner

    return ModelRunner(model, **computed, tp_rank=tp_rank, tp_size=tp_size)
