"""The engine core assembled by constructors: the scheduler, a runner, the I/O threads and the optional parts."""
from __future__ import annotations

import queue

import zmq

from rill.engine_proc.core import EngineCore
from rill.engine_proc.io_threads import InputThread, OutputThread
from rill.engine_proc.sched.admission import AdmissionControl
from rill.engine_proc.sched.deadlines import Deadlines
from rill.ipc.channels import RunPaths
from rill.ipc.config import EngineConfig


def start_core(config: EngineConfig, paths: RunPaths, scheduler, runner, *, rank: int = 0, make_grammar_gate=None,
               kv_events=None, kv_disk=None):
    """The busy loop's core with its input and output threads (started). `rank`: this engine's among
    --data-parallel-size; `make_grammar_gate(notify)`: structured outputs, None for a model that does
    not generate; `kv_events`: --kv-events-endpoint's publisher; `kv_disk`: --kv-cache-disk's DiskTier."""
    limits = config.scheduler
    ctx = zmq.Context()
    inputs: queue.SimpleQueue = queue.SimpleQueue()
    admission = AdmissionControl(limits.max_queued_requests, limits.max_queued_tokens,
                                 max_num_seqs=config.model.max_num_seqs)
    output_thread = OutputThread(ctx, paths, rank=rank, load_of=lambda: (scheduler.num_running, scheduler.num_waiting))
    input_thread = InputThread(ctx, paths, inputs, admission, output_thread.publish, rank=rank)
    input_thread.start()
    output_thread.start()
    grammar_gate = make_grammar_gate(inputs.put) if make_grammar_gate is not None else None
    core = EngineCore(scheduler, runner, inputs, output_thread.publish, admission=admission,
                      deadlines=Deadlines(limits.request_timeout_s), grammar_gate=grammar_gate, kv_events=kv_events,
                      rank=rank, kv_disk=kv_disk)
    return core, (input_thread, output_thread)
