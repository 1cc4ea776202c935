"""`rill serve --headless`: a node that runs its tensor-parallel ranks and no HTTP server.

Node 0's `rill serve` holds rank 0 (the engine) and serves HTTP; every other node runs this, which
starts the node's ranks (engine_proc/parallel/rank_worker.py), and they meet rank 0 at
--master-addr:--master-port. Exit status: 0 when rank 0 told the ranks to stop (node 0 stopped) or
on SIGTERM/SIGINT/SIGHUP (the ranks ignore SIGHUP and SIGINT: this process decides); 1 when a
rank died or could not join, so a supervisor restarts the node.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading

from rill.engine_proc.parallel.rank_worker import RankArgs, run_rank
from rill.ipc.logs import configure_logging

log = logging.getLogger("rill")


def serve_headless(args) -> int:
    configure_logging(args.log_level, args.log_format, args.log_requests)
    from rill.config_args import config_from_args
    from rill.launcher import resolve_model, set_engine_env_defaults

    config = config_from_args(args, *resolve_model(args)).engine
    parallel = config.parallel
    per_node = parallel.tensor_parallel_size // parallel.nnodes
    ranks = range(parallel.node_rank * per_node, (parallel.node_rank + 1) * per_node)
    threads = config.model.num_threads or max(1, (os.cpu_count() or 1) // per_node)
    set_engine_env_defaults()
    ctx = mp.get_context("spawn")
    procs = []
    for rank in ranks:
        rank_args = RankArgs(rank, parallel, config.log, device_type=_device_type(config.model.device),
                             model_dir=config.model.model_dir, num_threads=threads)
        proc = ctx.Process(target=run_rank, args=(rank_args,), name=f"rill-tp-rank-{rank}")
        proc.start()
        procs.append(proc)
    log.info("headless node %d of %d: ranks %s (pids %s) joining %s:%d", args.node_rank, args.nnodes, list(ranks),
             [p.pid for p in procs], args.master_addr, args.master_port)
    stop, signalled = threading.Event(), threading.Event()

    def on_signal(*_) -> None:
        signalled.set()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # a hangup stops the node as SIGTERM does
        signal.signal(sig, on_signal)
    # Woken when the first rank exits: at rank 0's stop message all of them do, at a death one does.
    threading.Thread(target=lambda: (multiprocessing.connection.wait([p.sentinel for p in procs]), stop.set()),
                     daemon=True).start()
    stop.wait()
    failed = [p for p in procs if p.exitcode not in (None, 0)]
    for proc in procs:
        if not (failed or signalled.is_set()):
            proc.join(5)  # rank 0's stop message reached every rank of this node
        if proc.is_alive():
            proc.terminate()
        proc.join()
    if failed:
        log.error("rank died: %s", [(p.name, p.pid, p.exitcode) for p in failed])
        return 1
    log.info("headless node %d stopped", args.node_rank)
    return 0


def _device_type(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
