"""RoPE's frequencies for the native model: the default, or a scaling fixed at load, from transformers' own functions."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rill.engine_proc.attention.kv_cache import head_dim_of

if TYPE_CHECKING:
    from transformers import PretrainedConfig


def rope_parameters(config: PretrainedConfig) -> dict:
    """rope_theta and scaling, from transformers 5's rope_parameters or the older fields."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if not params:
        params = dict(getattr(config, "rope_scaling", None) or {})
        params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_theta", 10000.0)
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    return params


# RoPE scalings fixed at load: transformers' own functions compute them. Not "dynamic" and "longrope",
# whose frequencies transformers changes with each sequence's length as it runs.
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_inv_freq(config: PretrainedConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim / 2] and the factor cos and sin are scaled by (YaRN's attention
    factor; 1 otherwise): the default written as transformers does, the scalings by transformers' own
    functions, so that fp32 matches bit for bit."""
    params = rope_parameters(config)
    rope_type = params["rope_type"]  # one of ROPE_TYPES (check_supported)
    if rope_type != "default":
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        with torch.device("cpu"):  # the model may be built under a meta-device context
            inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
        return inv_freq.float(), float(factor)
    dim = head_dim_of(config)
    base = params["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    return inv_freq, 1.0
