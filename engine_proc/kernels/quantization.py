"""`--quantization`: which weight-only scheme the linear layers take, checked at start, and the swap."""
from __future__ import annotations

import torch
from torch import nn

QUANTIZATION_METHODS = ("none", "int8", "int4")


def check_quantization(method: str, device: torch.device) -> None:
    """A known method, on a device that runs it: said at start rather than in the first step."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization {method!r}: expected one of {QUANTIZATION_METHODS}")
    if method != "none" and device.type != "cpu":
        raise ValueError(f"--quantization {method} is CPU-only for now (device {device.type}): its kernels are "
                         "C++ for x86 CPUs; use --quantization none")


def linear_class(method: str) -> type[nn.Module]:
    """The quantized linear of a method other than "none": Int8Linear or Int4Linear."""
    if method == "int8":
        from rill.engine_proc.kernels.int8_linear import Int8Linear

        return Int8Linear
    from rill.engine_proc.kernels.int4_linear import Int4Linear

    return Int4Linear


def quantize_linears(model: nn.Module, method: str = "int8") -> int:
    """Swap every nn.Linear for the method's quantized linear and give a tied head a quantized copy.

    The LM head stays int8 under int4, as llama.cpp's 4-bit files keep their output matrix at 6 or 8 bits:
    in 4 bits it alone cost the bundled model 5% of perplexity (bench/kernels/quant_quality.py).
    Returns how many layers were quantized. The float weights of the swapped layers are dropped
    with them; the embedding of a tied model stays float for its lookup.
    """
    make = linear_class(method)
    make_head = linear_class("int8")
    replacements = [
        (parent, child_name, child)
        for parent in model.modules()
        for child_name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, child_name, child in replacements:
        setattr(parent, child_name, (make_head if child_name == "lm_head" else make)(child.weight, child.bias))
    num_quantized = len(replacements)
    if getattr(model, "lm_head", 0) is None:  # Rill's Llama: None means tied to embed_tokens
        model.lm_head = make_head(model.embed_tokens.weight)
        num_quantized += 1
    return num_quantized
