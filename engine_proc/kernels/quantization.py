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


def quantize_linears(model: nn.Module, method: str = "int8", packed: dict | None = None,
                     int8: set[str] | frozenset = frozenset()) -> int:
    """Swap every nn.Linear for the method's quantized linear and give a tied head a quantized copy.

    The LM head stays int8 under int4, as llama.cpp's 4-bit files keep their output matrix at 6 or 8 bits:
    in 4 bits it alone cost the bundled model 5% of perplexity (bench/kernels/quant_quality.py).
    `packed`: qualified layer name -> a 4-bit weight as it is (int4; model/gguf_int4.py), for the layers it names;
    `int8`: the names of layers that are int8 whatever the method (a GGUF's wider types).
    Returns how many layers were quantized. The float weights of the swapped layers are dropped
    with them; the embedding of a tied model stays float for its lookup.
    """
    make = linear_class(method)
    make_head = linear_class("int8")
    packed = packed or {}
    replacements = [
        (parent, child_name, child, f"{prefix}.{child_name}".lstrip("."))
        for prefix, parent in model.named_modules()
        for child_name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, child_name, child, name in replacements:
        if child_name == "lm_head" or name in int8:
            layer = make_head(child.weight, child.bias)
        elif name in packed:
            layer = make(child.weight, child.bias, packed=packed[name])
        else:
            layer = make(child.weight, child.bias)
        setattr(parent, child_name, layer)
    num_quantized = len(replacements)
    if getattr(model, "lm_head", 0) is None:  # Rill's Llama: None means tied to embed_tokens
        model.lm_head = make_head(model.embed_tokens.weight)
        num_quantized += 1
    return num_quantized
