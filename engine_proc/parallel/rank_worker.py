"""A tensor-parallel rank other than 0: its shard of the model and KV cache, each step as rank 0 runs it.

It samples nothing and schedules nothing: rank 0's engine owns the requests. Each step arrives as a
StepMessage (engine_proc/parallel/step_message.py), from shared memory on rank 0's node and over
gloo from another node; the rank runs the same forward, and the collectives inside it (an
all-reduce per row-parallel layer, the head's all-gather) meet rank 0's.
"""
from __future__ import annotations

import logging
import signal

import msgspec
import torch
import torch.distributed as dist

from rill.ipc.config import LogConfig, ParallelConfig

log = logging.getLogger("rill.tp")


class RankArgs(msgspec.Struct):
    """What a rank needs before it joins the group; the rest (RankSetup) comes from rank 0."""

    rank: int
    parallel: ParallelConfig  # its master_addr and master_port where the group meets
    log: LogConfig
    device_type: str = "cpu"
    model_dir: str = ""  # this node's copy of the model; empty: the path rank 0 loads
    num_threads: int | None = None  # this node's choice; None: rank 0's


def run_rank(args: RankArgs, reader=None, all_reduce=None) -> None:
    """Process entry point. `reader`: the shared-memory broadcast's reader on rank 0's node; None on
    another node, where the steps come over the network. `all_reduce`: the ShmAllReduce of a group
    on one node."""
    from rill.engine_proc.model.runner import ModelRunner
    from rill.engine_proc.parallel import group
    from rill.engine_proc.parallel.step_broadcast import GlooBroadcast
    from rill.engine_proc.parallel.step_message import decoder, replica_batch
    from rill.ipc.lifetime import die_with_parent
    from rill.ipc.logs import configure_logging, route_transformers_logs

    die_with_parent()
    for sig in (signal.SIGINT, signal.SIGHUP):  # the launcher (or rank 0) decides when we stop
        signal.signal(sig, signal.SIG_IGN)
    configure_logging(args.log.level, args.log.format)
    if all_reduce is not None:
        from rill.engine_proc.parallel.collectives import use_shm_all_reduce

        all_reduce.attach(args.rank)  # before joining: rank 0 unlinks the segment once all have
        use_shm_all_reduce(all_reduce)
    world_size, parallel = args.parallel.tensor_parallel_size, args.parallel
    group.init_group(args.rank, world_size, parallel.master_addr, parallel.master_port, args.device_type)
    setup = group.share_setup(None)
    remote = group.remote_group(world_size, parallel.nnodes)
    threads = args.num_threads or setup.model.num_threads
    if threads:
        torch.set_num_threads(threads)
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if args.device_type == "cuda" else "cpu")
    model = msgspec.structs.replace(setup.model, model_dir=args.model_dir or setup.model.model_dir)
    runner = ModelRunner(model, dtype=getattr(torch, setup.dtype), device=device, num_kv_blocks=setup.num_kv_blocks,
                         eos_token_ids=setup.eos_token_ids, tp_rank=args.rank, tp_size=world_size)
    channel = reader if reader is not None else GlooBroadcast(group=remote)
    route_transformers_logs()  # where loading imported it (a scaled RoPE's functions, say)
    log.info("tensor-parallel rank %d of %d ready", args.rank, world_size)
    steps = 0
    while True:
        message = decoder.decode(channel.recv())
        if message.stop:
            break
        runner.forward_step(replica_batch(message), message.graphs)
        steps += 1
    log.info("tensor-parallel rank %d stopping after %d steps", args.rank, steps)
    if reader is not None:
        reader.close()
    dist.destroy_process_group()
