"""`rill serve --kv-cache-disk` and `--kv-cache-disk-size`: the prefix cache's disk tier (docs/kv-disk.md), and their checks."""
from __future__ import annotations

import argparse

DEFAULT_DISK_SIZE = "4GiB"


def add_kv_disk_flags(engine, byte_size) -> None:
    engine.add_argument("--kv-cache-disk", default="", metavar="PATH",
                        help="keep the prefix cache's full KV blocks in this folder too: evicted blocks are written "
                             "there, the hottest cached ones at a clean stop, and the hottest read back before the "
                             "server is ready, so a restart serves a repeated prompt from cache (docs/kv-disk.md); "
                             "none: no disk tier")
    engine.add_argument("--kv-cache-disk-size", type=byte_size, default=None, metavar="BYTES",
                        help=f"most bytes --kv-cache-disk holds (per engine), least recently used blocks deleted "
                             f"past it, e.g. 512MiB or 2GiB (default {DEFAULT_DISK_SIZE})")


def check_kv_disk_flags(args, parser: argparse.ArgumentParser, byte_size) -> None:
    """Exit 2 naming the flag for what cannot work (the engine refuses what only it sees: a model on the
    transformers route under --model-impl auto, a draft model)."""
    if not args.kv_cache_disk:
        if args.kv_cache_disk_size is not None:
            parser.error("--kv-cache-disk-size needs --kv-cache-disk PATH")
        return
    if args.kv_cache_disk_size is None:
        args.kv_cache_disk_size = byte_size(DEFAULT_DISK_SIZE)
    if args.kv_cache_disk_size <= 0:
        parser.error("--kv-cache-disk-size must be above 0")
    if not args.enable_prefix_caching:
        parser.error("--kv-cache-disk needs prefix caching: the blocks on disk are the prefix cache's "
                     "(drop --no-enable-prefix-caching)")
    if args.model_impl == "transformers":
        parser.error("--kv-cache-disk needs the native runner, not --model-impl transformers")
    if args.tensor_parallel_size > 1:
        parser.error("--kv-cache-disk is not served with --tensor-parallel-size > 1 (each rank holds a slice "
                     "of every block)")
