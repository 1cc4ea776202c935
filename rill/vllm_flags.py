"""`vllm serve`'s flags that a unit file or script written for vLLM carries, so that `rill serve` starts from it.
`--seed` works as vLLM's. The others mean nothing here: each is accepted and said once at start, with why, where
refusing it would only make a user edit the file. A flag whose meaning Rill cannot honour and whose silence would
mislead (a tokenizer from elsewhere) is not taken: argparse refuses it, naming it. `--revision` and
`--download-dir` are the model flags' (rill/cli.py): where a hub id is found in the local cache."""
from __future__ import annotations

import argparse
import sys

# flag: (argparse keywords, why it has no effect here)
NO_EFFECT: dict[str, tuple[dict, str]] = {
    "--trust-remote-code": ({"action": "store_true"},
                            "Rill runs no code from a model directory; the families it serves are its own"),
    "--disable-log-requests": ({"action": "store_true"}, "request content is logged only with --log-requests"),
    "--disable-log-stats": ({"action": "store_true"}, "Rill logs no periodic stats; /metrics and /stats have them"),
    "--enable-chunked-prefill": ({"action": argparse.BooleanOptionalAction, "default": None},
                                 "long prompts are always chunked, by --max-num-batched-tokens"),
    "--swap-space": ({"type": float, "metavar": "GIB"},
                     "a preempted request's KV blocks are recomputed, not swapped out"),
    "--gpu-memory-utilization": ({"type": float, "metavar": "FRACTION"},
                                 "the KV cache is sized by --kv-cache-memory"),
    "--uvicorn-log-level": ({"metavar": "LEVEL"}, "Rill serves with Granian, not uvicorn; --log-level sets its logs"),
    "--distributed-executor-backend": ({"metavar": "NAME"}, "Rill's ranks are its own processes (docs/tensor-parallel.md)"),
    "--disable-custom-all-reduce": ({"action": "store_true"}, "Rill has no custom all-reduce"),
}


def add_vllm_flags(ap: argparse.ArgumentParser) -> None:
    group = ap.add_argument_group("vLLM's flags", "taken so that a `vllm serve` command line starts rill serve")
    group.add_argument("--seed", type=int, default=None,
                       help="seeds the sampler's generator for requests without a seed of their own, so that a "
                            "restarted server samples them again alike (vLLM's; default: random each start)")
    for flag, (kwargs, why) in NO_EFFECT.items():
        group.add_argument(flag, help=f"accepted, no effect: {why}", **({"default": None} | kwargs))


def check_vllm_flags(args: argparse.Namespace, file=None) -> list[str]:
    """Says, once, which of the no-effect flags were given and why they do nothing; returns those flags."""
    given = [flag for flag in NO_EFFECT if getattr(args, flag.removeprefix("--").replace("-", "_")) is not None]
    for flag in given:
        print(f"rill serve: {flag} (vLLM's) has no effect here: {NO_EFFECT[flag][1]}", file=file or sys.stderr)
    return given
