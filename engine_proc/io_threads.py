"""The engine's socket threads: decode inputs into a queue, encode each step's outputs out.

Socket I/O stays off the busy loop: the input thread turns Submit messages into
EngineRequests (copying prompt ids out of the worker's ring), and the output thread fans a
step's deltas out to the workers that own them (ids through each worker's output ring).
"""
from __future__ import annotations

import logging
import queue
import threading
from collections import defaultdict

import zmq

from engine_proc.request import EngineRequest
from ipc import protocol as p
from ipc.channels import OUTPUT_RING_IDS, PROMPT_RING_IDS, RunPaths, make_socket
from ipc.shm_ring import ShmRing

log = logging.getLogger("rill.engine")


class InputThread(threading.Thread):
    """PULL socket -> queue of EngineRequest | Abort | StatsQuery | Shutdown."""

    def __init__(self, ctx: zmq.Context, paths: RunPaths, inputs: queue.SimpleQueue):
        super().__init__(name="engine-input", daemon=True)
        self.paths = paths
        self.inputs = inputs
        self.sock = make_socket(ctx, zmq.PULL, paths.engine_input, bind=True)
        self.prompt_rings: dict[str, ShmRing] = {}

    def run(self) -> None:
        while True:
            msg = p.input_decoder.decode(self.sock.recv(copy=False).buffer)
            if isinstance(msg, p.Submit):
                self.inputs.put(self._to_request(msg))
            else:
                self.inputs.put(msg)
                if isinstance(msg, p.Shutdown):
                    return

    def _to_request(self, msg: p.Submit) -> EngineRequest:
        if msg.prompt is not None:
            ring = self.prompt_rings.get(msg.worker_id)
            if ring is None:
                ring = ShmRing(self.paths.prompt_ring(msg.worker_id), PROMPT_RING_IDS, create=False)
                self.prompt_rings[msg.worker_id] = ring
            prompt_ids = ring.read(msg.prompt).tolist()
        else:
            prompt_ids = msg.prompt_ids or []
        return EngineRequest(msg.req_id, msg.worker_id, prompt_ids, msg.params)

    def close(self) -> None:
        for ring in self.prompt_rings.values():
            ring.close()
        self.sock.close()


class OutputThread(threading.Thread):
    """Queue of per-step outputs -> one StepOutputs message per owning worker."""

    def __init__(self, ctx: zmq.Context, paths: RunPaths):
        super().__init__(name="engine-output", daemon=True)
        self.ctx = ctx
        self.paths = paths
        self.outputs: queue.SimpleQueue = queue.SimpleQueue()
        self.socks: dict[str, zmq.Socket] = {}
        self.rings: dict[str, ShmRing] = {}

    def publish(self, item: list[tuple[str, p.RequestDelta, list[int]]] | tuple[str, p.EngineStats] | None) -> None:
        self.outputs.put(item)

    def run(self) -> None:
        while (item := self.outputs.get()) is not None:
            if isinstance(item, tuple):
                self._send(item[0], item[1])
                continue
            by_worker: dict[str, tuple[list[p.RequestDelta], list[int]]] = defaultdict(lambda: ([], []))
            for worker_id, delta, new_ids in item:
                deltas, ids = by_worker[worker_id]
                deltas.append(delta)
                ids.extend(new_ids)
            for worker_id, (deltas, ids) in by_worker.items():
                where = self._ring(worker_id).write(ids)
                msg = p.StepOutputs(deltas, ids=where, inline_ids=None if where else ids)
                self._send(worker_id, msg)
        self.close()

    def _ring(self, worker_id: str) -> ShmRing:
        ring = self.rings.get(worker_id)
        if ring is None:
            ring = ShmRing(self.paths.output_ring(worker_id), OUTPUT_RING_IDS, create=True)
            self.rings[worker_id] = ring
        return ring

    def _send(self, worker_id: str, msg) -> None:
        sock = self.socks.get(worker_id)
        if sock is None:
            sock = make_socket(self.ctx, zmq.PUSH, self.paths.worker_output(worker_id), bind=False)
            self.socks[worker_id] = sock
        try:
            sock.send(p.output_encoder.encode(msg), flags=zmq.NOBLOCK)
        except zmq.Again:  # that worker is gone or stuck: its requests are lost to it anyway
            log.warning("dropping outputs for unresponsive worker %s", worker_id)

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        for ring in self.rings.values():
            ring.close()
