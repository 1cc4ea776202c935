"""`rill bench sweep`: one server over a list of concurrencies or request rates; the list flags compare shares."""
from __future__ import annotations

import argparse
import sys

from rill.bench.serving import compare
from rill.bench.serving.axis import add_axis_args, base_config, resolve_axis

DEFAULT_CONCURRENCY = [1, 4, 16, 64]


def add_sweep_args(parser: argparse.ArgumentParser) -> None:
    add_axis_args(parser, DEFAULT_CONCURRENCY, default_rounds=1)


def main(args: argparse.Namespace) -> int:
    try:
        axis = resolve_axis(args, DEFAULT_CONCURRENCY)
        label = args.label or args.model or base_config(args, axis).base_url
    except ValueError as exc:
        print(f"rill bench sweep: error: {exc}", file=sys.stderr)
        return 2
    # No URL of its own: the server is the one --base-url (or --host/--port) names.
    return compare.execute("sweep", args, [compare.Server(label, None, None)], axis, label)
