"""`python -m rill.bench SUBCOMMAND` (also `rill bench`): serve, compare, sweep."""
from __future__ import annotations

import argparse
import importlib
import sys

# name -> help; the module bench.serving.<name> has add_<name>_args(parser) and main(args) -> int.
SUBCOMMANDS = {
    "serve": "benchmark one OpenAI-compatible server (latency and throughput, vLLM's metrics)",
    "compare": "run the same workload against several servers and compare them",
    "sweep": "run a benchmark over a range of loads",
}


def add_bench_subcommands(sub) -> None:
    """Add one parser per subcommand to an argparse subparsers object."""
    for name, help_text in SUBCOMMANDS.items():
        parser = sub.add_parser(name, help=help_text, description=help_text,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        module = importlib.import_module(f"rill.bench.serving.{name}")
        getattr(module, f"add_{name}_args")(parser)
        parser.set_defaults(bench_main=module.main)


def build_parser(prog: str = "python -m rill.bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Rill's serving benchmarks.")
    add_bench_subcommands(parser.add_subparsers(dest="bench_command", required=True))
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m rill.bench") -> int:
    args = build_parser(prog).parse_args(argv)
    return args.bench_main(args) or 0


if __name__ == "__main__":
    sys.exit(main())
