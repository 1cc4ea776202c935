"""Rank 0's side of tensor parallelism: start this node's other ranks, share the setup, send each
step, notice a rank's death, stop them all.

The engine process is rank 0: it keeps the scheduler, the block tables and the sampler, and holds
its own shard. Ranks 1..k-1 of its node are processes it spawns (they die with it); the ranks of
other nodes are started there by `rill serve --headless` (rill/headless.py) and join through
the TCPStore at --master-addr:--master-port.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import threading

import msgspec

from rill.engine_proc.parallel import group
from rill.engine_proc.parallel.collectives import use_shm_all_reduce
from rill.engine_proc.parallel.rank_worker import RankArgs, run_rank
from rill.engine_proc.parallel.shm_all_reduce import ShmAllReduce
from rill.engine_proc.parallel.step_broadcast import GlooBroadcast, ShmBroadcast
from rill.engine_proc.parallel.step_message import STOP, encode_step
from rill.ipc.config import LogConfig, ParallelConfig

log = logging.getLogger("rill.tp")


class TensorParallel:
    """Rank 0's handle on the group; `send(batch, graphs)` before each step's forward."""

    def __init__(self, parallel: ParallelConfig, device_type: str, log_config: LogConfig) -> None:
        size, nnodes = parallel.tensor_parallel_size, parallel.nnodes
        if size % nnodes:
            raise ValueError(f"--tensor-parallel-size {size} does not split evenly over --nnodes {nnodes}")
        self.size, self.nnodes = size, nnodes
        self.block_size = 16
        per_node = size // nnodes
        self.master_addr = parallel.master_addr or "127.0.0.1"
        self.master_port = parallel.master_port or group.free_port(self.master_addr)
        # Where the group meets, decided: what every rank is told (RankArgs, RankSetup).
        self.parallel = msgspec.structs.replace(parallel, master_addr=self.master_addr, master_port=self.master_port)
        ctx = mp.get_context("spawn")
        self.shm = ShmBroadcast.create("rill-tp", per_node - 1, ctx=ctx) if per_node > 1 else None
        # One node: the all-reduces through shared memory too (engine_proc/parallel/shm_all_reduce.py).
        self.all_reduce = ShmAllReduce(size, ctx) if nnodes == 1 and device_type == "cpu" else None
        self.procs = []
        for rank in range(1, per_node):
            args = RankArgs(rank, self.parallel, log_config, device_type)
            proc = ctx.Process(target=run_rank, args=(args, self.shm.reader(rank - 1), self.all_reduce),
                               name=f"rill-tp-rank-{rank}", daemon=True)
            proc.start()
            self.procs.append(proc)
        self.stopping = False
        threading.Thread(target=self._watch, name="tp-watch", daemon=True).start()
        log.info("tensor parallelism: %d ranks on %d node(s), rendezvous at %s:%d; local ranks %s",
                 size, nnodes, self.master_addr, self.master_port, [p.pid for p in self.procs])
        if self.all_reduce is not None:
            self.all_reduce.attach(0)
            use_shm_all_reduce(self.all_reduce)
        group.init_group(0, size, self.master_addr, self.master_port, device_type)
        # Every local rank mapped the segments before it could join the group: unlinked now, they
        # leave nothing in /dev/shm however this process ends (each keeps its mapping).
        if self.shm is not None:
            self.shm.path.unlink(missing_ok=True)
        if self.all_reduce is not None:
            self.all_reduce.unlink()
        self.remote = None

    def share(self, setup: group.RankSetup) -> None:
        """Send the setup every rank builds its shard from (before rank 0 builds its own)."""
        self.block_size = setup.model.block_size
        group.share_setup(setup)
        remote = group.remote_group(self.size, self.nnodes)
        self.remote = GlooBroadcast(group=remote) if remote is not None else None

    def send(self, batch, graphs: bool) -> None:
        self._publish(encode_step(batch, graphs, self.block_size))

    def _publish(self, payload: bytes, timeout: float | None = None) -> None:
        if self.shm is not None:
            self.shm.publish(payload, timeout)
        if self.remote is not None:
            self.remote.publish(payload)

    def _watch(self) -> None:
        """A local rank that dies takes the engine with it: the launcher then fails the streams and
        exits non-zero, as for the engine's own death. (A rank on another node breaks the next
        collective, which fails the step, which stops the engine.)"""
        if not self.procs:
            return
        multiprocessing.connection.wait([p.sentinel for p in self.procs])
        if not self.stopping:
            dead = [(p.name, p.pid, p.exitcode) for p in self.procs if not p.is_alive()]
            log.error("tensor-parallel rank died (%s): stopping the engine", dead)
            os._exit(1)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Tell every rank to exit, and wait for this node's."""
        self.stopping = True
        try:
            self._publish(STOP, timeout=timeout_s)  # a dead rank's full ring must not hang us
        except Exception as exc:  # a rank already gone: the others are killed below
            log.warning("could not tell the ranks to stop: %s", exc)
        for proc in self.procs:
            proc.join(timeout_s)
            if proc.is_alive():
                proc.kill()
        if self.shm is not None:
            self.shm.close()
