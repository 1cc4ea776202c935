"""The axis `rill bench sweep` and `compare` vary: --max-concurrency or --request-rate as lists, rounds, --out."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Axis:
    """The knob being varied, its values, and the other knob held constant."""
    name: str  # "max_concurrency" or "request_rate", a BenchConfig field
    values: list
    fixed: dict


def serve_module():
    # Imported when used: bench/serving/serve.py is the load generator these commands drive.
    return importlib.import_module("rill.bench.serving.serve")


def int_list(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"need integers >= 1: {text!r}")
    return values


def rate_list(text: str) -> list[float]:
    """'1,2,4' -> [1.0, 2.0, 4.0] requests/s; 'inf' sends everything at once."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not values or min(values) <= 0 or any(math.isnan(v) for v in values):
        raise argparse.ArgumentTypeError(f"need rates > 0: {text!r}")
    return values


def _listify(parser: argparse.ArgumentParser, option: str, parse, metavar: str, help_text: str):
    """Turn a scalar flag of add_serve_args into a list flag; returns its scalar default."""
    # argparse has no public way to change a flag once added; its actions list is stable API in practice.
    for action in parser._actions:
        if option in action.option_strings:
            original = action.default
            # SUPPRESS: no attribute unless given, so resolve_axis can tell, and no "(default: None)" in --help.
            action.type, action.default, action.metavar, action.help = parse, argparse.SUPPRESS, metavar, help_text
            return original
    raise LookupError(f"add_serve_args defines no {option}")


def add_axis_args(parser: argparse.ArgumentParser, default_concurrency: list[int], default_rounds: int) -> None:
    """The `bench serve` flags with --max-concurrency and --request-rate taking lists, plus rounds and --out."""
    serve_module().add_serve_args(parser)
    default_text = ",".join(map(str, default_concurrency))
    scalar_defaults = {
        "max_concurrency": _listify(parser, "--max-concurrency", int_list, "N,N,...",
                                    f"comma-separated concurrencies to run (default {default_text})"),
        "request_rate": _listify(parser, "--request-rate", rate_list, "RATE,RATE,...",
                                 "comma-separated request rates (req/s) to run instead, e.g. 1,2,4; "
                                 "one value is held constant while the concurrency varies"),
    }
    # The serve defaults stand in for whichever knob is not varied.
    parser.set_defaults(bench_scalar_defaults=scalar_defaults)
    group = parser.add_argument_group("rounds and output")
    group.add_argument("--rounds", type=int, default=default_rounds,
                       help="times every setting runs, one round after another; the report shows medians")
    group.add_argument("--cooldown-s", type=float, default=0.0, help="seconds of idle between two runs")
    group.add_argument("--keep-per-request", action="store_true",
                       help="keep each run's per-request lists (ttfts, itls, ...) in the JSON; big")
    group.add_argument("--out", type=Path, default=None, help="output folder; unset: bench/results/<command>-<date>")


def resolve_axis(args: argparse.Namespace, default_concurrency: list[int]) -> Axis:
    """Which knob varies: --request-rate when it lists several rates or is the only one given."""
    concurrencies, rates = getattr(args, "max_concurrency", None), getattr(args, "request_rate", None)
    scalar_defaults = getattr(args, "bench_scalar_defaults", {"max_concurrency": None, "request_rate": math.inf})
    if concurrencies and rates and len(concurrencies) > 1 and len(rates) > 1:
        raise ValueError("vary --max-concurrency or --request-rate, not both")
    if args.rounds < 1:
        raise ValueError("--rounds must be >= 1")
    if rates and (len(rates) > 1 or not concurrencies):
        held = concurrencies[0] if concurrencies else scalar_defaults["max_concurrency"]
        return Axis("request_rate", rates, {"max_concurrency": held})
    held = rates[0] if rates else scalar_defaults["request_rate"]
    return Axis("max_concurrency", concurrencies or list(default_concurrency), {"request_rate": held})


def base_config(args: argparse.Namespace, axis: Axis):
    """config_from_args on a copy of args whose list flags are scalars again."""
    scalar = argparse.Namespace(**vars(args))
    setattr(scalar, axis.name, axis.values[0])
    for name, value in axis.fixed.items():
        setattr(scalar, name, value)
    return serve_module().config_from_args(scalar)
