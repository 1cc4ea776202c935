"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Granite, SmolLM3, Phi-3) in plain torch over the paged KV cache."""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from rill.engine_proc.attention.backend import AttentionBackend, TorchBackend
from rill.engine_proc.attention.kv_cache import AttentionMetadata, GraphDecodeMetadata, GraphPrefillMetadata, KVCache
from rill.engine_proc.attention.kv_layout import head_dim_of, num_kv_heads_of
from rill.engine_proc.kernels import prefill_layer
from rill.engine_proc.kernels.fused_ops import TorchOps, elementwise_ops
from rill.engine_proc.model import llama_weights
from rill.engine_proc.model.rope import ROPE_TYPES, rope_inv_freq, rope_parameters
from rill.engine_proc.parallel.collectives import tp_all_reduce, tp_gather_vocab
from rill.engine_proc.parallel.sharding import Shard

if TYPE_CHECKING:
    from transformers import PretrainedConfig

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "granite", "smollm3", "phi3")


def check_supported(config: PretrainedConfig) -> None:
    if config.model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {config.model_type!r} is not supported: {SUPPORTED_MODEL_TYPES}")
    window_len = getattr(config, "sliding_window", None) or math.inf
    uses_window = config.model_type in ("mistral", "phi3") and window_len < config.max_position_embeddings
    if uses_window or getattr(config, "use_sliding_window", False):
        raise ValueError("sliding-window attention is not supported")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act {config.hidden_act!r} is not supported (only silu)")
    rope = rope_parameters(config)
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("partial rotary embeddings are not supported")
    rope_type = rope["rope_type"]
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type {rope_type!r} is not supported {ROPE_TYPES}")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.ops = TorchOps  # the fused ops where the model's bind_kernels finds them

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def forward_with_add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(residual + x), residual + x)."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


class Attention(nn.Module):
    """`reduce`: the all-reduce after o_proj (tensor parallelism: each rank's heads' partial sums);
    `backend`: the runner's attention backend (engine_proc/attention/choice.py), held for every call."""

    def __init__(self, config: PretrainedConfig, layer_index: int, backend: AttentionBackend, reduce=_identity) -> None:
        super().__init__()
        self.layer_index = layer_index
        self.backend = backend
        self.reduce = reduce
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = num_kv_heads_of(config)
        self.head_dim = head_dim_of(config)
        attention_bias = bool(getattr(config, "attention_bias", False))
        qkv_bias = attention_bias or config.model_type == "qwen2"  # Qwen2 always biases q, k, v
        # q, k and v in one matmul: one weight read and one kernel launch instead of three.
        qkv_dim = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(config.hidden_size, qkv_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=attention_bias)
        self.q_norm = self.k_norm = None
        if config.model_type == "qwen3":
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.ops, self.fused_qkv_rope = TorchOps, False  # set by bind_kernels

    def bind_kernels(self, ops: type[TorchOps]) -> None:
        """The elementwise ops, and whether q and k leave qkv_proj rotated (its kernel's epilogue,
        an AmxLinear's: heads of 64, no per-head norms to apply between)."""
        self.ops = ops
        self.fused_qkv_rope = (self.q_norm is None and self.head_dim == 64
                               and getattr(self.qkv_proj, "fuses_rope", False))

    def _qkv_rope(self, x, cos, sin, heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k and v [T, heads, D], q and k rotated (after their per-head norms where the model has them)."""
        qkv = self.qkv_proj(x).view(x.shape[0], sum(heads), self.head_dim)
        q, k, v = qkv.split(heads, dim=1)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
            return self.ops.rope_heads(q, self.num_heads, cos, sin), self.ops.rope_heads(k, self.num_kv_heads, cos, sin), v
        # Without per-head norms q and k rotate together in one pass (in qkv itself where fused).
        q, k = self.ops.rope_heads(qkv, self.num_heads + self.num_kv_heads, cos, sin).split(heads[:2], dim=1)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        meta: AttentionMetadata,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The attention output of every token, or of the tokens `rows` only (after all K/V are written)."""
        num_tokens = x.shape[0]
        heads = (self.num_heads, self.num_kv_heads, self.num_kv_heads)
        if self.fused_qkv_rope:  # q and k leave the kernel rotated (its epilogue): no second pass over them
            qkv = self.qkv_proj.rope(x, cos, sin, self.num_heads + self.num_kv_heads).view(num_tokens, sum(heads), 64)
            q, k, v = qkv.split(heads, dim=1)
        else:
            q, k, v = self._qkv_rope(x, cos, sin, heads)
        if isinstance(meta, GraphDecodeMetadata):  # a compiled decode step: its K/V written and attended by one op
            o = self.backend.graph_decode(q, k, v, meta, self.layer_index)
            return self.reduce(self.o_proj(o.reshape(num_tokens, self.num_heads * self.head_dim)))
        if isinstance(meta, GraphPrefillMetadata):  # a compiled prompt step: likewise one op
            o = self.backend.graph_prefill(q, k, v, meta, self.layer_index)
            return self.reduce(self.o_proj(o.reshape(num_tokens, self.num_heads * self.head_dim)))
        o = self.backend.forward(q, k, v, k_cache, v_cache, meta).reshape(num_tokens, self.num_heads * self.head_dim)
        return self.reduce(self.o_proj(o if rows is None else o.index_select(0, rows)))


class MLP(nn.Module):
    def __init__(self, config: PretrainedConfig, reduce=_identity) -> None:
        super().__init__()
        self.reduce = reduce
        bias = bool(getattr(config, "mlp_bias", False))
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=bias)
        self.ops, self.fused_silu_mul = TorchOps, False  # set by bind_kernels

    def bind_kernels(self, ops: type[TorchOps]) -> None:
        """The elementwise ops, and whether gate_up_proj applies the SiLU in its epilogue (an AmxLinear's)."""
        self.ops, self.fused_silu_mul = ops, getattr(self.gate_up_proj, "fuses_silu_mul", False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused_silu_mul:
            return self.reduce(self.down_proj(self.gate_up_proj.silu_mul(x)))
        return self.reduce(self.down_proj(self.ops.silu_mul(self.gate_up_proj(x))))


class DecoderLayer(nn.Module):
    def __init__(self, config: PretrainedConfig, layer_index: int, backend: AttentionBackend, reduce=_identity) -> None:
        super().__init__()
        self.input_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn = Attention(config, layer_index, backend, reduce)
        self.post_attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, reduce)

    def forward(self, h, residual, cos, sin, meta, k_cache, v_cache, rows=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(this layer's MLP output, the residual stream before it): `h` is the previous layer's MLP
        output, not yet added to `residual` (the embeddings, and None, for the first layer). Each
        add is fused into the norm that follows it (add_rms_norm). With `rows`, past the
        K/V writes only those tokens go on (the last layer: the rows the head reads)."""
        if residual is None:
            residual, x = h, self.input_norm(h)
        else:
            x, residual = self.input_norm.forward_with_add(h, residual)
        a = self.attn(x, cos, sin, meta, k_cache, v_cache, rows)
        if rows is not None:
            residual = residual.index_select(0, rows)
        x, residual = self.post_attn_norm.forward_with_add(a, residual)
        return self.mlp(x), residual


class LlamaForCausalLM(nn.Module):
    """The whole model, or with `shard` one tensor-parallel rank's part of it
    (engine_proc/parallel/sharding.py): its heads and MLP columns, an all-reduce after each
    row-parallel layer, its vocabulary rows of the head, whose logits one all-gather joins.
    `attention`: the runner's attention backend (the torch one when None)."""

    def __init__(self, config: PretrainedConfig, shard: Shard | None = None,
                 attention: AttentionBackend | None = None) -> None:
        super().__init__()
        check_supported(config)
        # Not a buffer: rebuilt after the module is materialised from the meta device. From the whole
        # model's config (a rank's has its share of the heads).
        self.inv_freq, self.rope_factor = rope_inv_freq(config)
        self.attention = attention = attention or TorchBackend()
        self.shard = shard if shard is not None and shard.size > 1 else None
        self.config = config = self.shard.local_config() if self.shard else config
        reduce = tp_all_reduce if self.shard else _identity
        # Given its weight, and initialised as nn.Embedding would be unless on the meta device (the loader's), where
        # a random init imports torch._dynamo (0.8 s of an eager engine's start) for values a checkpoint replaces.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        if not self.embed_tokens.weight.is_meta:
            nn.init.normal_(self.embed_tokens.weight)
        self.layers = nn.ModuleList(DecoderLayer(config, i, attention, reduce) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        # None when tied: the embedding matrix serves as the head (a packed copy may replace it).
        # A rank's head is its own vocabulary rows, tied or not.
        self.lm_head = None
        if self.shard:
            self.lm_head = nn.Linear(config.hidden_size, self.shard.vocab_per_rank, bias=False)
        elif not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        # Granite's multipliers: the embedding's, the residual branches' and attention's are folded
        # into the weights at load (llama_weights.fold_multipliers); what is left is one scale of the
        # head's input, which a tied head (the scaled embedding) owes the embedding's too.
        embedding = llama_weights.multiplier(config, "embedding_multiplier") if self.lm_head is None else 1.0
        self.head_scale = 1.0 / (llama_weights.multiplier(config, "logits_scaling") * embedding)
        # SmolLM3's NoPE layers (no_rope_layers[i] == 0) rotate by nothing: cos 1, sin 0 (layer_rope).
        flags = getattr(config, "no_rope_layers", None)
        self.rope_layers = [bool(f) for f in flags] if flags and not all(flags) else None
        # Whether every layer must see every token row (LoRA's linears hold per-row masks); else
        # the last layer goes past its K/V writes with the rows the head reads alone.
        self.all_rows_to_the_end = False
        self.prefill_layer_args: list | None = None  # prefill_layer.run's per-layer arguments, built on first use

    def bind_kernels(self) -> None:
        """Chooses every layer's kernel paths once, from the modules as loaded: the fused elementwise
        ops where the C++ kernels are loaded for this device and dtype, the projections' fused
        epilogues where their kind has them, and the fused prompt layers' arguments anew (built at
        the next prompt step). The loader calls it; so does whatever swaps the linears after (LoRA)."""
        ops = elementwise_ops(self.norm.weight)  # (a tied embedding may have no weight: PanelEmbedding)
        for module in self.modules():
            if isinstance(module, RMSNorm):
                module.ops = ops
        for layer in self.layers:
            layer.attn.bind_kernels(ops)
            layer.mlp.bind_kernels(ops)
        self.prefill_layer_args = None

    def rope_cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, D/2] for the step, computed once and shared by all layers."""
        inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.to(torch.float32).unsqueeze(1) * inv_freq.unsqueeze(0)
        cos, sin = freqs.cos(), freqs.sin()
        if self.rope_factor != 1.0:  # YaRN's attention factor, in fp32 as transformers applies it
            cos, sin = cos * self.rope_factor, sin * self.rope_factor
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)

    def layer_rope(self, cos: torch.Tensor, sin: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (cos, sin): the step's, or the identity rotation for a NoPE layer."""
        if self.rope_layers is None:
            return [(cos, sin)] * len(self.layers)
        identity = (torch.ones_like(cos), torch.zeros_like(sin))
        return [(cos, sin) if rope else identity for rope in self.rope_layers]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVCache,
        logits_indices: torch.Tensor,
        hidden_only: bool = False,
    ) -> torch.Tensor:
        """Logits [len(logits_indices), vocab] for the chosen tokens of the flattened step
        (`hidden_only`: their final hidden states [len(logits_indices), hidden], before the head)."""
        h, residual = self.embed_tokens(input_ids), None
        rope = self.layer_rope(*self.rope_cos_sin(positions, h.dtype))
        # Past the last layer's K/V writes every op is per token: only the rows the head reads need
        # them (a 512-token prompt's last layer then runs its o_proj and MLP on one row). Compiled
        # decode steps read every row.
        trim = (not self.all_rows_to_the_end and not torch.compiler.is_compiling()
                and logits_indices.shape[0] < input_ids.shape[0])
        last_rows = logits_indices if trim else None
        # A step of fresh prompts on the AMX path: each layer one C++ call (kernels/prefill_layer.py).
        # is_compiling() first: a compiled decode step must not read (and so guard on) the metadata.
        done = None
        if (self.attention.fused_prompt_layers and not torch.compiler.is_compiling()
                and (bounds := prefill_layer.step_bounds(meta)) is not None):
            done = prefill_layer.run(self, h, rope, meta, kv_cache, bounds, last_rows)
        if done is not None:
            h, residual = done
        else:
            last = len(self.layers) - 1
            for i, (layer, (cos, sin), k_cache, v_cache) in enumerate(
                    zip(self.layers, rope, kv_cache.k_caches, kv_cache.v_caches)):
                h, residual = layer(h, residual, cos, sin, meta, k_cache, v_cache, last_rows if i == last else None)
        if not trim:
            h, residual = h.index_select(0, logits_indices), residual.index_select(0, logits_indices)
        h, _ = self.norm.forward_with_add(h, residual)
        return h if hidden_only else self.lm_logits(h)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits of final hidden states (the rows the head reads)."""
        if self.head_scale != 1.0:
            h = h * self.head_scale
        if self.lm_head is None:
            return F.linear(h, self.embed_tokens.weight)
        if self.shard:
            return tp_gather_vocab(self.lm_head(h), self.config.vocab_size)
        return self.lm_head(h)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        llama_weights.load_weights(self, weights)
        llama_weights.fold_multipliers(self)

    def init_dummy_weights(self, seed: int = 0) -> None:
        llama_weights.init_dummy_weights(self, seed)
        llama_weights.fold_multipliers(self)
