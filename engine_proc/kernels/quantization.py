"""`--quantization`: which weight-only scheme the linear layers take, checked at start, and the swap."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

QUANTIZATION_METHODS = ("none", "int8", "int4")


def check_quantization(method: str, device: torch.device, group_size: int = 32, symmetric: bool = False) -> None:
    """A known method, on a device that runs it, and int4's options only for int4: said at start rather than in the
    first step."""
    if method not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization {method!r}: expected one of {QUANTIZATION_METHODS}")
    if group_size not in (32, 128):
        raise ValueError(f"--int4-group-size {group_size}: expected 32 or 128")
    if method != "int4" and (group_size != 32 or symmetric):
        raise ValueError(f"--int4-group-size and --int4-symmetric are int4's options, not {method}'s: "
                         "add --quantization int4")
    if method != "none" and device.type != "cpu":
        raise ValueError(f"--quantization {method} is CPU-only for now (device {device.type}): its kernels are "
                         "C++ for x86 CPUs; use --quantization none")


def swappable(parent: nn.Module, child: nn.Module) -> bool:
    """An nn.Linear the CPU kernels or a quantized linear may take over: not a mixture of experts' router (HunYuan's
    gate keeps its float32 weight, which its forward reads), whose routing a rounding would change."""
    return type(child) is nn.Linear and not type(parent).__name__.endswith(("Gate", "Router"))


def linear_class(method: str, group_size: int = 32, symmetric: bool = False) -> Callable[..., nn.Module]:
    """The quantized linear of a method other than "none": Int8Linear, or Int4Linear with int4's options."""
    if method == "int8":
        from rill.engine_proc.kernels.int8_linear import Int8Linear

        return Int8Linear
    from rill.engine_proc.kernels.int4_linear import Int4Linear

    return functools.partial(Int4Linear, group_size=group_size, symmetric=symmetric)


def quantize_linears(model: nn.Module, method: str = "int8", packed: dict | None = None,
                     int8: set[str] | frozenset = frozenset(), group_size: int = 32, symmetric: bool = False) -> int:
    """Swap every nn.Linear for the method's quantized linear and give a tied head a quantized copy.

    The LM head stays int8 under int4, as llama.cpp's 4-bit files keep their output matrix at 6 or 8 bits:
    in 4 bits it alone cost the bundled model 5% of perplexity (bench/kernels/quant_quality.py).
    `packed`: qualified layer name -> a 4-bit weight as it is (int4; model/gguf_int4.py), for the layers it names;
    `int8`: the names of layers that are int8 whatever the method (a GGUF's wider types); `group_size` and
    `symmetric`: int4's (kernels/int4_linear.py).
    Returns how many layers were quantized. The float weights of the swapped layers are dropped
    with them; the embedding of a tied model stays float for its lookup.
    """
    make = linear_class(method, group_size, symmetric)
    make_head = linear_class("int8")
    packed = packed or {}
    replacements = [
        (parent, child_name, child, f"{prefix}.{child_name}".lstrip("."))
        for prefix, parent in model.named_modules()
        for child_name, child in parent.named_children()
        if swappable(parent, child)
    ]
    for parent, child_name, child, name in replacements:
        if child_name == "lm_head" or name in int8:
            layer = make_head(child.weight, child.bias)
        elif name in packed:
            layer = make(child.weight, child.bias, packed=packed[name])  # as they are, whatever the options
        else:
            layer = make(child.weight, child.bias)
        setattr(parent, child_name, layer)
    num_quantized = len(replacements)
    if getattr(model, "lm_head", 0) is None:  # Rill's Llama: None means tied to embed_tokens
        model.lm_head = make_head(model.embed_tokens.weight)
        num_quantized += 1
    return num_quantized
