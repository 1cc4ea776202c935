"""The engine's socket threads: decode inputs into a queue, encode each step's outputs out.

Socket I/O stays off the busy loop: the input thread turns Submit messages into
EngineRequests (admitting or refusing each at once under admission control, see
engine_proc/sched/admission.py), and the output thread fans a step's deltas out to the workers that
own them.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import defaultdict

import msgspec
import zmq

from rill.engine_proc.sched.admission import AdmissionControl
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths, make_socket

log = logging.getLogger("rill.engine")


class InputThread(threading.Thread):
    """PULL socket -> queue of EngineRequest | Abort | StatsQuery | Shutdown.

    Under admission control each Submit gets its Admission from here, through the output
    thread's queue (`publish`): ahead of any delta of its requests, and never behind a step.
    """

    def __init__(self, ctx: zmq.Context, paths: RunPaths, inputs: queue.SimpleQueue,
                 admission: AdmissionControl | None = None, publish=None, rank: int = 0):
        super().__init__(name="engine-input", daemon=True)
        self.inputs = inputs
        self.admission = AdmissionControl() if admission is None else admission
        self.publish = publish  # OutputThread.publish; needed only when admission is enabled
        self.sock = make_socket(ctx, zmq.PULL, paths.engine_input_for(rank), bind=True)

    def run(self) -> None:
        while True:
            msg = p.input_decoder.decode(self.sock.recv(copy=False).buffer)
            if isinstance(msg, p.Submit):
                self.submit(msg)
            else:
                self.inputs.put(msg)
                if isinstance(msg, p.Shutdown):
                    return

    def submit(self, msg: p.Submit) -> None:
        admission = self.admission
        verdict = admission.admit(len(msg.req_ids), msg.n * sum(len(ids) for ids in msg.prompts))
        if admission.enabled:
            retry_after_s = 0 if verdict is p.Verdict.ADMITTED else admission.retry_after_s()
            limit = admission.limit_of(verdict)
            self.publish((msg.worker_id, p.Admission(msg.req_ids[0], verdict, retry_after_s, limit)))
        if verdict is not p.Verdict.ADMITTED:
            return
        arrival_s = time.monotonic()
        for i, req_id in enumerate(msg.req_ids):
            prompt_ids = msg.prompts[i // msg.n]  # shared by a prompt's choices: never mutated
            self.inputs.put(EngineRequest(req_id, msg.worker_id, prompt_ids, choice_params(msg.params, i % msg.n),
                                          arrival_s=arrival_s))

    def close(self) -> None:
        self.sock.close()


def choice_params(params: p.SamplingParams, choice: int) -> p.SamplingParams:
    """A prompt's choice j is seeded seed + j (vLLM's parallel sampling); unseeded ones share params."""
    if choice == 0 or params.seed is None:
        return params
    return msgspec.structs.replace(params, seed=params.seed + choice)


class OutputThread(threading.Thread):
    """Queue of per-step outputs -> one StepOutputs message per owning worker."""

    def __init__(self, ctx: zmq.Context, paths: RunPaths, rank: int = 0, load_of=lambda: (0, 0)):
        super().__init__(name="engine-output", daemon=True)
        self.ctx = ctx
        self.paths = paths
        self.outputs: queue.SimpleQueue = queue.SimpleQueue()
        self.socks: dict[str, zmq.Socket] = {}
        # --data-parallel-size: each StepOutputs tells its worker this engine's rank and queue, which
        # the workers' choice of engine reads (asgi/engine_link/dp_router.py).
        self.rank = rank
        self.load_of = load_of  # () -> (running, waiting), read when a message goes out

    def publish(self, item: list[tuple[str, p.RequestDelta, list[int]]] | tuple[str, p.EngineStats | p.Admission]
                | None) -> None:
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
            running, waiting = self.load_of()
            for worker_id, (deltas, ids) in by_worker.items():
                self._send(worker_id, p.StepOutputs(deltas, ids, self.rank, running, waiting))
        self.close()

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
