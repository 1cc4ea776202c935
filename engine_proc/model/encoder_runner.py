"""Embeds whole prompts with a sentence-transformers encoder: one pooled vector per finished prompt."""
from __future__ import annotations

import logging

import numpy as np
import torch
from transformers import AutoModel

from rill.engine_proc.model.hf_runner import KVBudget
from rill.engine_proc.model.runner_api import RunnerInfo
from rill.engine_proc.model.sentence_layout import PoolingSpec, read_pooling
from rill.engine_proc.sample.sampler import SamplerOutput
from rill.engine_proc.sched.batch import Batch
from rill.ipc.config import ModelConfig

log = logging.getLogger("rill.model")

# Prompts are sorted by length and padded in groups. A group takes the next prompt while the padding
# it would then hold stays within PAD_BUDGET_TOKENS: about the fixed cost of one more forward in
# tokens' worth of work (all-MiniLM-L6-v2 on the CPU, one thread: ~5 ms a forward, ~0.14 ms a token;
# bench/kernels/encoder_groups.py). So padding never costs more than the forwards it saves, and one long
# prompt does not make short ones pay for its positions. Measured on the CPU only.
PAD_BUDGET_TOKENS = 32
# And while it holds at most this many padded positions: bounds the activations of one forward.
MAX_GROUP_TOKENS = 8192


class EncoderRunner:
    """The `Runner` protocol for an embedding model: `execute(batch)` is one engine step.

    An encoder attends both ways, so a prompt cannot be run in chunks with a cache: a chunk that
    does not reach the end of its prompt does nothing, and the step that does embeds the whole
    prompt. No KV cache exists; `kv_cache` only carries the scheduler's block figures.
    """

    info = RunnerInfo("encoder")
    lora = None  # no adapters on an encoder
    sliding_window = None
    layer_window = None

    def __init__(self, model: ModelConfig, *, dtype: torch.dtype, device: torch.device | str, num_kv_blocks: int) -> None:
        """`model`: the settings (ipc/config.py); the rest was decided at start (engine_proc/encoder_engine.py)."""
        model_dir, block_size = model.model_dir, model.block_size
        self.pooling: PoolingSpec = read_pooling(model_dir)
        self.dtype = dtype
        self.device = torch.device(device)
        self.block_size = block_size
        self.model = AutoModel.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
        self.model = self.model.to(self.device).eval().requires_grad_(False)
        self.config = self.model.config
        self.vocab_size: int = self.config.vocab_size
        limits = [self.pooling.max_seq_length, getattr(self.config, "max_position_embeddings", None)]
        self.max_model_len: int = min([n for n in limits if n] or [num_kv_blocks * block_size])
        self.embedding_dim: int = self.pooling.dimension
        if self.embedding_dim != self.config.hidden_size:
            raise ValueError(f"{model_dir}: pooling dimension {self.embedding_dim} is not the model's hidden size "
                             f"{self.config.hidden_size} (a projection module Rill does not run?)")
        self.kv_cache = KVBudget(num_blocks=num_kv_blocks, block_size=block_size, num_bytes=0)
        self._pad_id = getattr(self.config, "pad_token_id", None) or 0
        log.info("encoder: %s pooling%s, %d dims, max_model_len %d", self.pooling.mode,
                 " + L2 normalisation" if self.pooling.normalize else "", self.embedding_dim, self.max_model_len)

    def close(self) -> None:
        """Nothing to stop (the `Runner` protocol, engine_proc/model/runner_api.py)."""

    def execute(self, batch: Batch) -> SamplerOutput:
        """A placeholder token id (-1) per seq of `batch.sampled_seqs`, and `out.embeddings`:
        (seq, float32 vector [embedding_dim]) for each, in that order."""
        seqs = batch.sampled_seqs
        out = SamplerOutput([-1] * len(seqs))
        vectors = self.embed([seq.req.prompt_ids for seq in seqs])
        out.embeddings = list(zip(seqs, vectors))
        return out

    def embed(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """One vector per prompt (token ids), in order; grouped by length for the forwards."""
        vectors: list[np.ndarray | None] = [None] * len(prompts)
        for group in length_groups([len(p) for p in prompts], PAD_BUDGET_TOKENS, MAX_GROUP_TOKENS):
            pooled = self._embed_group([prompts[i] for i in group])
            for i, vector in zip(group, pooled):
                vectors[i] = vector
        return vectors

    @torch.inference_mode()
    def _embed_group(self, prompts: list[list[int]]) -> np.ndarray:
        """[len(prompts), embedding_dim] float32: the prompts right-padded into one forward."""
        max_len = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), max_len), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), max_len), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        hidden = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
        pooled = pool(hidden, mask, self.pooling.mode)
        if self.pooling.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        return pooled.cpu().numpy()


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """hidden [n, L, d] and mask [n, L] (1 on real tokens, which come first) -> [n, d]."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "lasttoken":
        last = mask.sum(dim=1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    real = mask.unsqueeze(-1).bool()
    if mode == "max":
        return hidden.masked_fill(~real, float("-inf")).amax(dim=1)
    assert mode == "mean", mode
    return (hidden * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)


def length_groups(lengths: list[int], pad_budget_tokens: int, max_group_tokens: int) -> list[list[int]]:
    """Indices of `lengths` in groups to pad together: sorted by length, a group grows while its
    padding stays within `pad_budget_tokens` and its padded size within `max_group_tokens`."""
    groups: list[list[int]] = []
    num_real = 0  # real tokens of the last group
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]
        num_padded = (len(groups[-1]) + 1) * n if groups else 0  # n is the group's longest
        if groups and num_padded - num_real - n <= pad_budget_tokens and num_padded <= max_group_tokens:
            groups[-1].append(i)
            num_real += n
        else:
            groups.append([i])
            num_real = n
    return groups
