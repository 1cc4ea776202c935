"""`rill serve --quantization` and int4's options, and their checks: how the weights are stored (CPU only)."""
from __future__ import annotations

import argparse


def add_quantization_flags(model) -> None:
    model.add_argument("--quantization", "-q", default="none", choices=["none", "int8", "int4"],
                       help="int8: weight-only int8 (per-output-channel scales) for every linear layer and the LM "
                            "head, a quarter of float32's weight bytes; int4: 4-bit groups of 32 with a float16 scale "
                            "and offset each, 5 bits a weight, the head int8; CPU only (see docs/quantization.md)")
    model.add_argument("--int4-group-size", type=int, default=32, choices=[32, 128],
                       help="int4: the weights a scale and offset cover (128: 4.25 bits a weight)")
    model.add_argument("--int4-symmetric", action="store_true",
                       help="int4: no offsets, w = (q - 8) * scale as GGUF's Q4_0 (4.5 bits a weight in groups of 32, "
                            "4.125 in groups of 128); a GGUF's Q4_0 blocks are kept so whatever this says")


def check_quantization_flags(args, parser: argparse.ArgumentParser) -> None:
    """Exit 2 naming the flag for int4's options without int4 (the engine refuses a GPU, which only it can see)."""
    if args.quantization != "int4" and (args.int4_group_size != 32 or args.int4_symmetric):
        flag = "--int4-symmetric" if args.int4_symmetric else f"--int4-group-size {args.int4_group_size}"
        parser.error(f"{flag} is an option of --quantization int4, not of --quantization {args.quantization}")
