"""`python -m bench SUBCOMMAND`: serve (and compare, sweep where their modules exist).

A subcommand is a module `bench.<name>` with `add_<name>_args(parser)` and `main(args) -> int`;
list it in SUBCOMMANDS. Modules are looked up when the parser is built, so this file works
before the later ones are written; one that fails to import still gets a subcommand, which
reports the import error when it is run instead of breaking its siblings.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# name -> help; the module is bench.<name>.
SUBCOMMANDS = {
    "serve": "benchmark one OpenAI-compatible server (latency and throughput, vLLM's metrics)",
    "compare": "run the same workload against several servers and compare them",
    "sweep": "run a benchmark over a range of loads",
}


def _broken(name: str, exc: Exception):
    def main(_args: argparse.Namespace) -> int:
        print(f"bench {name}: cannot import bench.{name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return main


def add_bench_subcommands(sub) -> None:
    """Add one parser per available subcommand to an argparse subparsers object.

    `rill bench` reuses this: `add_bench_subcommands(bench_parser.add_subparsers(dest="bench_command",
    required=True))`, then `sys.exit(args.bench_main(args))`.
    """
    for name, help_text in SUBCOMMANDS.items():
        if importlib.util.find_spec(f"bench.{name}") is None:
            continue  # not written yet
        # resolve: a subcommand may redefine a serve flag it reuses (sweep's --label names the server).
        parser = sub.add_parser(name, help=help_text, description=help_text, conflict_handler="resolve",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        try:
            module = importlib.import_module(f"bench.{name}")
            getattr(module, f"add_{name}_args")(parser)
            parser.set_defaults(bench_main=module.main)
        except Exception as exc:  # a sibling's bug must not take `bench serve` down with it
            parser.set_defaults(bench_main=_broken(name, exc))


def build_parser(prog: str = "python -m bench") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Rill's serving benchmarks.")
    add_bench_subcommands(parser.add_subparsers(dest="bench_command", required=True))
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m bench") -> int:
    args = build_parser(prog).parse_args(argv)
    return args.bench_main(args) or 0


if __name__ == "__main__":
    sys.exit(main())
