"""transformers' model under the native model's forward signature, and the family's final logit soft-capping taken out
of its forward: what the paged transformers route (hf_paged.py) and its compiled decode steps call."""
from __future__ import annotations

import functools

import torch

from rill.engine_proc.kernels import extension


class LogitsForward(torch.nn.Module):
    """transformers' model under the native model's forward signature (input ids, positions, a
    compiled decode step's metadata or None, the cache, the rows to keep): the logits of those rows,
    the final soft-capping applied. The compiled decode steps call it with their metadata, which goes
    down to each attention layer (hf_attention.py's rill_graph); an eager step with None, inside its
    step_context."""

    def __init__(self, model: torch.nn.Module, attention, final_soft_cap) -> None:
        super().__init__()
        self.model, self.attention, self.config, self.final_soft_cap = model, attention, model.config, final_soft_cap

    def forward(self, input_ids, positions, graph_meta, kv_cache, logits_indices, image_inputs=None,
                rope_positions=None) -> torch.Tensor:
        """`image_inputs`: the forward's keywords for a step with images, in place of its ids (hf_vision.py: the input
        embeddings, or a DeepStack model's ids and image outputs); `rope_positions` [3, tokens]: a 3-D rotary
        model's positions, in place of `positions`."""
        tokens = image_inputs or {"input_ids": input_ids.unsqueeze(0)}
        position_ids = positions.unsqueeze(0) if rope_positions is None else rope_positions.unsqueeze(1)
        out = self.model(**tokens, position_ids=position_ids, use_cache=False,
                         logits_to_keep=logits_indices, rill_graph=graph_meta)
        logits = out.logits[0]
        return logits if self.final_soft_cap is None else self.final_soft_cap(logits)


def final_soft_cap(model: torch.nn.Module, device: torch.device, dtype: torch.dtype):
    """The family's final logit soft-capping (Gemma 2: cap * tanh(logits / cap)) taken out of its
    forward, as a function of the logits that the runner applies (None without one): torch's tanh is
    slow on the CPU. A compiled 16-row decode step of Gemma 2's bench shape took 5.40 ms with the
    family's tanh, 4.37 ms with the C++ kernel, 4.32 ms without the cap (Zen 4, one run). Elsewhere
    the sigmoid form, which Inductor and Triton vectorize."""
    cap = getattr(model.config, "final_logit_softcapping", None)
    if not cap:
        return None
    model.config.final_logit_softcapping = None
    if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and extension.available():
        return functools.partial(torch.ops.rill_cpu.soft_cap, cap=float(cap))
    return lambda logits: torch.sigmoid(logits * (2.0 / cap)) * (2.0 * cap) - cap
