"""RoPE scalings that transformers works out from the longest position of its forward's batch
("longrope": Phi-3.5, Phi-4-mini; "dynamic" NTK), made independent of the other sequences of a step
for the paged route, where a step's sequences are one row of tokens (engine_proc/model/hf_paged.py).
The rotary module's forward is replaced by one that computes cos and sin from per-token inverse
frequencies, with the module's own attention scaling.

LongRoPE: transformers uses the short factors while a sequence is within
`original_max_position_embeddings` and the long ones past it, and when a sequence crosses over,
its generate throws the cache away and computes the whole sequence again with the long ones. A
paged cache shared between requests cannot do that, so, as vLLM does, the factors are chosen once
for the server: the long ones when its context (--max-model-len, by default the model's) is longer
than the original, else the short ones. A sequence that goes past the original context then gets
exactly transformers' results; a shorter one gets the long factors where transformers would use
the short, unless the server is started with --max-model-len at most the original context.

Dynamic NTK: transformers rescales the base by the sequence's length past `max_position_embeddings`
and keeps what the cache holds; here each token gets the base of its own sequence's length at the
end of the step's chunk, which is what transformers' generate gives a single sequence (the prompt
at once, then a token at a time). A compiled decode step's token has the length position + 1.
"""
from __future__ import annotations

import logging
import types

import torch
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from rill.engine_proc.model.hf_attention import current_step

log = logging.getLogger("rill.model")
LENGTH_DEPENDENT_TYPES = ("dynamic", "longrope")


def install_paged_rope(model: torch.nn.Module, device: torch.device, max_model_len: int) -> int:
    """Replaces the forward of every rotary module of `model` with a dynamic or LongRoPE scaling
    (for each of its layer types); how many. `max_model_len`: the server's context."""
    num = 0
    for module in model.modules():
        rope_types = getattr(module, "rope_type", None)
        if not isinstance(rope_types, (str, dict)) or not hasattr(module, "config"):
            continue
        per_type = {None: rope_types} if isinstance(rope_types, str) else dict(rope_types)
        if not any(t in LENGTH_DEPENDENT_TYPES for t in per_type.values()):
            continue
        module.rill_inv_freq = {layer_type: _inv_freq_of(module, rope_type, layer_type, device, max_model_len)
                                for layer_type, rope_type in per_type.items()}
        module.forward = types.MethodType(paged_rope_forward, module)
        num += 1
    return num


def paged_rope_forward(self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None):
    """transformers' rotary signature: x (for its dtype and device), position_ids [1, T]; cos and
    sin [1, T, rotary dim]."""
    positions = position_ids[0]
    inv_freq = self.rill_inv_freq[layer_type]
    if callable(inv_freq):  # dynamic NTK: each token's base from its sequence's length
        inv_freq = inv_freq(positions + 1 if torch.compiler.is_compiling() else current_step().rope_lens)
    freqs = positions.unsqueeze(1).float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    scaling = self.attention_scaling if layer_type is None else getattr(self, f"{layer_type}_attention_scaling")
    return (emb.cos() * scaling).to(x.dtype).unsqueeze(0), (emb.sin() * scaling).to(x.dtype).unsqueeze(0)


def _inv_freq_of(module, rope_type: str, layer_type: str | None, device: torch.device, max_model_len: int):
    """The inverse frequencies [rotary dim / 2] for every token, or (dynamic NTK) a function of each
    token's sequence length, lens [T], to them [T, rotary dim / 2]."""
    prefix = "" if layer_type is None else f"{layer_type}_"
    original = getattr(module, f"{prefix}original_inv_freq").to(device)
    config = module.config
    params = config.rope_parameters if layer_type is None else config.rope_parameters[layer_type]
    if rope_type == "longrope":  # one set of factors for the server (the module's docstring)
        limit = params["original_max_position_embeddings"]
        chosen = original
        if max_model_len > limit:
            chosen, _ = ROPE_INIT_FUNCTIONS[rope_type](config, device, seq_len=limit + 1, layer_type=layer_type)
            chosen = chosen.to(device)
        log.info("LongRoPE: the %s factors for every sequence (a context of %d tokens; the model's original is %d%s)",
                 "long" if max_model_len > limit else "short", max_model_len, limit,
                 f": --max-model-len {limit} or less takes the short ones" if max_model_len > limit else "")
        return chosen
    if rope_type == "dynamic":  # transformers' _compute_dynamic_ntk_parameters, a base per token
        base, factor, max_len = params["rope_theta"], params["factor"], config.max_position_embeddings
        dim = 2 * original.shape[0]
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim

        def dynamic(lens: torch.Tensor) -> torch.Tensor:
            length = torch.clamp(lens, min=max_len).unsqueeze(1)
            scaled = base * ((factor * length / max_len) - (factor - 1)) ** (dim / (dim - 2))
            return 1.0 / (scaled**exponents)

        return dynamic
    return original
