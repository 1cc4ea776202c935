"""RoPE's frequencies for the native model: the default, or a scaling fixed at load.

The default and the `linear`, `llama3` (Llama 3.x's) and `yarn` scalings are computed here, in the same float32 steps
as transformers, so that they match its frequencies bit for bit (tests/unit/test_rope.py); any of them with a partial
rotary factor by transformers' own functions.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from rill.engine_proc.attention.kv_layout import head_dim_of

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
    factor; 1 otherwise)."""
    params = rope_parameters(config)
    rope_type = params["rope_type"]  # one of ROPE_TYPES (check_supported)
    if rope_type not in ("default", "linear", "llama3", "yarn") or params.get("partial_rotary_factor", 1.0) != 1.0:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        with torch.device("cpu"):  # the model may be built under a meta-device context
            inv_freq, factor = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
        return inv_freq.float(), float(factor)
    dim = head_dim_of(config)
    if rope_type == "yarn":
        return _yarn(dim, params)
    inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim))
    if rope_type == "linear":
        inv_freq /= params["factor"]
    elif rope_type == "llama3":
        inv_freq = _llama3(inv_freq, params)
    return inv_freq, 1.0


def _llama3(inv_freq: torch.Tensor, params: dict) -> torch.Tensor:
    """Llama 3.1's scaling: wavelengths shorter than the original context over high_freq_factor are kept, those longer
    than it over low_freq_factor are divided by `factor`, and those between go smoothly from one to the other."""
    factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
    context = params["original_max_position_embeddings"]
    wavelength = 2 * math.pi / inv_freq
    long = wavelength > context / low
    scaled = torch.where(long, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    between = ~(wavelength < context / high) * ~long
    return torch.where(between, (1 - smooth) * scaled / factor + smooth * scaled, scaled)


def _yarn(dim: int, params: dict) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): dimensions that turn many times within the original context keep their frequency,
    those that turn less than once are interpolated (divided by `factor`), a linear ramp between; cos and sin are
    scaled by the attention factor (given, or 0.1 ln(factor) + 1, or DeepSeek's ratio of two such with mscale)."""
    base, factor, context = params["rope_theta"], params["factor"], params["original_max_position_embeddings"]
    attention = params.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        attention = float(_mscale(factor, mscale) / _mscale(factor, mscale_all_dim)) if mscale and mscale_all_dim \
            else _mscale(factor)

    def dimension(rotations: float) -> float:  # where a dimension turns `rotations` times in the original context
        return (dim * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = dimension(params.get("beta_fast") or 32), dimension(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    kept = 1 - torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
    powers = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    return (1.0 / (factor * powers)) * (1 - kept) + (1.0 / powers) * kept, attention


def _mscale(factor: float, mscale: float = 1) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0
