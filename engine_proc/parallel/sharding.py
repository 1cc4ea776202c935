"""Which slice of each Llama weight a tensor-parallel rank holds (Megatron-style).

q, k, v and gate, up are split by output rows (column-parallel: each rank computes its own
heads and its own slice of the MLP); o_proj and down_proj by input columns (row-parallel: each
rank's partial sums are added by an all-reduce). A rank holds whole KV heads and the query heads
that read them. Heads need not divide evenly: the bundled model's 3 KV heads over 2 ranks are 2
and 1, as its intermediate size or a vocabulary split unevenly would be. The LM head is split by
vocabulary rows, padded to equal slices so one all-gather puts the logits back together; the
embedding is replicated (a lookup, no matmul to split).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from rill.engine_proc.attention.kv_layout import head_dim_of, num_kv_heads_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def split_range(total: int, size: int, rank: int) -> tuple[int, int]:
    """[start, end) of `rank`'s share of `total` items over `size` ranks; the first ranks get
    one more when `size` does not divide `total`."""
    base, extra = divmod(total, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


@dataclass(frozen=True)
class Shard:
    """Rank `rank` of `size`, for one model config: its heads, MLP columns and vocabulary rows."""

    rank: int
    size: int
    config: PretrainedConfig

    def __post_init__(self) -> None:
        kv_heads = num_kv_heads_of(self.config)
        if kv_heads < self.size:
            raise ValueError(f"--tensor-parallel-size {self.size} is more than the model's {kv_heads} KV heads: "
                             "each rank holds at least one")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {self.rank} is outside a tensor-parallel group of {self.size}")

    @property
    def kv_heads(self) -> tuple[int, int]:
        return split_range(num_kv_heads_of(self.config), self.size, self.rank)

    @property
    def q_heads(self) -> tuple[int, int]:
        group = self.config.num_attention_heads // num_kv_heads_of(self.config)
        start, end = self.kv_heads
        return start * group, end * group

    @property
    def intermediate(self) -> tuple[int, int]:
        return split_range(self.config.intermediate_size, self.size, self.rank)

    @property
    def vocab_per_rank(self) -> int:
        return -(-self.config.vocab_size // self.size)

    @property
    def vocab(self) -> tuple[int, int]:
        """This rank's vocabulary rows (the last rank's slice may be short: padded with zeros)."""
        start = self.rank * self.vocab_per_rank
        return min(start, self.config.vocab_size), min(start + self.vocab_per_rank, self.config.vocab_size)

    def local_config(self) -> PretrainedConfig:
        """The config this rank's modules and KV cache are built from: its heads, its MLP width."""
        local = copy.deepcopy(self.config)
        head_dim = head_dim_of(self.config)
        local.head_dim = head_dim  # no longer hidden_size // num_attention_heads
        local.num_attention_heads = self.q_heads[1] - self.q_heads[0]
        local.num_key_value_heads = self.kv_heads[1] - self.kv_heads[0]
        local.intermediate_size = self.intermediate[1] - self.intermediate[0]
        return local

    def slice(self, hf_name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's part of the Hugging Face tensor `hf_name` (a view; the whole when replicated)."""
        module, _, leaf = hf_name.rpartition(".")
        head_dim = head_dim_of(self.config)
        if module.endswith("self_attn.q_proj"):
            start, end = self.q_heads
            return tensor.narrow(0, start * head_dim, (end - start) * head_dim)
        if module.endswith(("self_attn.k_proj", "self_attn.v_proj")):
            start, end = self.kv_heads
            return tensor.narrow(0, start * head_dim, (end - start) * head_dim)
        if module.endswith(("mlp.gate_proj", "mlp.up_proj")):
            start, end = self.intermediate
            return tensor.narrow(0, start, end - start)
        if module.endswith(("self_attn.o_proj", "mlp.down_proj")):
            if leaf == "bias":  # added once, after the all-reduce's sum: rank 0 holds it
                return tensor if self.rank == 0 else torch.zeros_like(tensor)
            start, end = self.q_heads if module.endswith("o_proj") else self.intermediate
            scale = head_dim if module.endswith("o_proj") else 1
            return tensor.narrow(1, start * scale, (end - start) * scale)
        return tensor

    def head_rows(self, weight: torch.Tensor) -> torch.Tensor:
        """This rank's LM-head rows of a [vocab, hidden] weight, zero-padded to vocab_per_rank."""
        start, end = self.vocab
        rows = weight.narrow(0, start, end - start)
        if end - start == self.vocab_per_rank:
            return rows
        padded = weight.new_zeros(self.vocab_per_rank, weight.shape[1])
        padded[: end - start] = rows
        return padded
