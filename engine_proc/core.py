"""The engine's busy loop: drain inputs, schedule, run the model, publish the step's deltas."""
from __future__ import annotations

import logging
import queue
import resource
import time

from engine_proc.batch import Batch, TokenDelta
from engine_proc.request import EngineRequest
from engine_proc.scheduler import Scheduler
from ipc import protocol as p
from ipc.logprobs import encode_logprobs

log = logging.getLogger("rill.engine")


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner, inputs: queue.SimpleQueue, publish, clock=time.monotonic):
        self.scheduler = scheduler
        self.runner = runner
        self.inputs = inputs
        self.publish = publish  # callable taking one step's outputs (see OutputThread.publish)
        self.clock = clock  # stamps each request's queue, prefill and decode times (the metrics)
        self.num_aborted = 0
        self.num_finished = 0
        self.num_generated_tokens = 0
        self.running = True

    def run_busy_loop(self) -> None:
        while True:
            self.drain_inputs(block=not self.scheduler.has_work)
            if not self.running:
                return
            batch = self.scheduler.schedule()
            deltas = self.step(batch) if batch else []
            self.publish_deltas(deltas + self.scheduler.take_errored())

    def step(self, batch: Batch) -> list[TokenDelta]:
        now = self.clock()
        for seq in batch.seqs:
            if not seq.req.scheduled_s:
                seq.req.scheduled_s = now
        try:
            sampled = self.runner.execute(batch)
        except Exception:  # a bug in the model path must not take every other request down
            log.exception("model step failed; ending the %d requests of this batch", len(batch.seqs))
            return [self._fail(seq.req) for seq in batch.seqs]
        if sampled.logprobs is None:
            return self.scheduler.update(batch, sampled)
        # Read before update(): it appends the sampled ids, after which no seq needs a sample.
        # One sampled seq per request per step; a request aborted meanwhile gets no delta.
        logprobs_of = {id(s.req): lp for s, lp in zip(batch.sampled_seqs, sampled.logprobs)}
        deltas = self.scheduler.update(batch, sampled)
        for d in deltas:
            d.logprobs = logprobs_of.get(id(d.req))
        return deltas

    def _fail(self, req: EngineRequest) -> TokenDelta:
        self.scheduler.abort(req.req_id)
        return TokenDelta(req, [], p.FinishReason.ERROR)

    def drain_inputs(self, *, block: bool) -> None:
        try:
            item = self.inputs.get(timeout=None) if block else self.inputs.get_nowait()
            while True:
                self.handle(item)
                item = self.inputs.get_nowait()
        except queue.Empty:
            pass

    def handle(self, item) -> None:
        if isinstance(item, EngineRequest):
            item.arrival_s = item.arrival_s or self.clock()  # the input thread stamps it on receipt
            self.scheduler.add(item)
        elif isinstance(item, p.Abort):
            for req_id in item.req_ids:
                if self.scheduler.abort(req_id) is not None:
                    self.num_aborted += 1
        elif isinstance(item, p.StatsQuery):
            self.publish((item.worker_id, self.stats()))
        elif isinstance(item, p.Shutdown):
            self.running = False
        elif isinstance(item, p.AbortAll):
            self.abort_all()

    def abort_all(self) -> None:
        """Ends every request with an ABORT delta, which its worker turns into an error event."""
        reqs = [r for req_id in self.scheduler.live_req_ids() if (r := self.scheduler.abort(req_id))]
        self.num_aborted += len(reqs)
        self.publish_deltas([TokenDelta(req, [], p.FinishReason.ABORT) for req in reqs])

    def stats(self) -> p.EngineStats:
        blocks = self.scheduler.block_manager
        return p.EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            num_free_blocks=blocks.num_free_blocks(),
            num_total_blocks=blocks.num_total_blocks(),
            num_aborted=self.num_aborted,
            num_finished=self.num_finished,
            num_prefix_queries_tokens=self.scheduler.num_prefix_queries_tokens,
            num_prefix_hit_tokens=self.scheduler.num_prefix_hit_tokens,
            peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
            kv_cache_bytes=self.runner.kv_cache.num_bytes,
            num_preemptions=self.scheduler.num_preemptions,
            num_generated_tokens=self.num_generated_tokens,
        )

    def publish_deltas(self, deltas: list[TokenDelta]) -> None:
        if not deltas:
            return
        out = []
        now = self.clock()
        for d in deltas:
            req = d.req
            first = len(req.output_ids) <= len(d.new_ids)
            if d.new_ids and not req.first_token_s:
                req.first_token_s = now
            delta = p.RequestDelta(
                req.req_id,
                len(d.new_ids),
                d.finish,
                num_prompt_tokens=req.num_prompt_tokens if first or d.finish else 0,
                num_cached_tokens=req.num_cached_tokens if first or d.finish else 0,
                logprobs=None if d.logprobs is None else encode_logprobs(d.logprobs),
                timings=None if d.finish is None else req.timings(now),
            )
            out.append((req.worker_id, delta, d.new_ids))
            self.num_generated_tokens += len(d.new_ids)
            if d.finish is not None and d.finish is not p.FinishReason.ABORT:  # aborts: num_aborted
                self.num_finished += 1
        self.publish(out)
