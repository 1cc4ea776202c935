"""`rill serve`'s tensor-parallel and multi-node flags (docs/tensor-parallel.md), their checks, and how
the engines and ranks of this node share its cores."""
from __future__ import annotations

import argparse
import os

import msgspec

from rill.ipc.config import EngineConfig

DEFAULT_MASTER_PORT = 29500  # torch.distributed's usual one


def add_parallel_flags(engine) -> None:
    engine.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, metavar="N",
                        help="shard the model over N ranks (Megatron-style: heads and MLP columns; gloo on a CPU, "
                             "NCCL on GPUs); the engine is rank 0 and starts this node's other ranks")
    engine.add_argument("--nnodes", type=int, default=1, help="nodes the tensor-parallel ranks span")
    engine.add_argument("--node-rank", type=int, default=0, help="this node's rank (0 serves HTTP)")
    engine.add_argument("--master-addr", default="127.0.0.1",
                        help="node 0's address, where every rank meets (torch.distributed's TCPStore)")
    engine.add_argument("--master-port", type=int, default=None,
                        help=f"the TCPStore's port (default {DEFAULT_MASTER_PORT} over several nodes, a free port on one)")
    engine.add_argument("--headless", action="store_true",
                        help="run this node's ranks and no HTTP server (every node but node 0)")


def check_parallel_flags(args, parser: argparse.ArgumentParser) -> None:
    """Exit 2 with a clear message for a combination that cannot work."""
    tp, nnodes = args.tensor_parallel_size, args.nnodes
    if tp < 1 or nnodes < 1:
        parser.error("--tensor-parallel-size and --nnodes must be at least 1")
    if tp % nnodes:
        parser.error(f"--tensor-parallel-size {tp} must split evenly over --nnodes {nnodes}")
    if not 0 <= args.node_rank < nnodes:
        parser.error(f"--node-rank {args.node_rank} must be in [0, --nnodes {nnodes})")
    if args.node_rank > 0 and not args.headless:
        parser.error("a node other than node 0 runs --headless (node 0 serves HTTP)")
    if args.headless and args.node_rank == 0:
        parser.error("--headless is for nodes 1 and up: node 0 holds rank 0, the engine")
    if tp > 1 and args.data_parallel_size > 1:
        parser.error("--tensor-parallel-size with --data-parallel-size is not supported yet: choose one")
    if args.master_port is None:
        args.master_port = DEFAULT_MASTER_PORT if nnodes > 1 else 0


def engine_configs(config: EngineConfig) -> list[EngineConfig]:
    """One engine's config per --data-parallel-size rank; on a CPU without --num-threads, each engine
    (and each of its tensor-parallel ranks on this node) gets its share of the cores."""
    parallel = config.parallel
    ranks_here = parallel.data_parallel_size * (parallel.tensor_parallel_size // parallel.nnodes)
    if ranks_here <= 1:
        return [config]
    threads = config.model.num_threads or max(1, (os.cpu_count() or 1) // ranks_here)
    shared = msgspec.structs.replace(config, model=msgspec.structs.replace(config.model, num_threads=threads))
    return [shared] * parallel.data_parallel_size
