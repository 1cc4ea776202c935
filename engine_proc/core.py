"""The engine's busy loop: drain inputs, end overdue requests, schedule, run the model, publish."""
from __future__ import annotations

import logging
import queue
import resource
import time

import msgspec

from rill.engine_proc.grammar.compiler import GrammarCompiled
from rill.engine_proc.grammar.gate import GrammarGate
from rill.engine_proc.model.memory import release_free_heap, resident_bytes, weight_bytes
from rill.engine_proc.model.runner_api import Runner
from rill.engine_proc.sched.admission import AdmissionControl
from rill.engine_proc.sched.batch import Batch, TokenDelta
from rill.engine_proc.sched.deadlines import Deadlines
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc import protocol as p
from rill.ipc.logprobs import TokenLogprobs, encode_logprobs

log = logging.getLogger("rill.engine")
_NOT_FINISHED = (p.FinishReason.ABORT, p.FinishReason.TIMEOUT, p.FinishReason.CANCELLED)  # not num_finished


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: Runner, inputs: queue.SimpleQueue, publish, clock=time.monotonic,
                 admission: AdmissionControl | None = None, deadlines: Deadlines | None = None,
                 grammar_gate: GrammarGate | None = None, kv_events=None, rank: int = 0, kv_disk=None):
        self.scheduler = scheduler
        self.runner = runner
        self.inputs = inputs
        self.publish = publish  # callable taking one step's outputs (see OutputThread.publish)
        self.clock = clock  # stamps each request's queue, prefill and decode times (the metrics)
        self.num_aborted = 0
        self.num_finished = 0
        self.num_generated_tokens = 0
        self.num_timed_out = 0
        # The input thread admits against the queue figures we report after each schedule().
        self.admission = AdmissionControl() if admission is None else admission
        self.deadlines = Deadlines() if deadlines is None else deadlines  # --request-timeout
        self.grammar_gate = grammar_gate  # structured outputs; None: such requests end with ERROR
        self._num_taken = self._num_taken_tokens = 0  # requests taken in since the last report
        self.running = True
        self.kv_events = kv_events  # --kv-events-endpoint: a KVEventPublisher (engine_proc/kv_events.py)
        self.rank = rank  # --data-parallel-size: this engine's rank
        self.kv_disk = kv_disk  # --kv-cache-disk: a DiskTier (engine_proc/kv_disk/tier.py)
        self.weight_bytes = weight_bytes(getattr(runner, "model", None))  # as loaded (prepacked, quantized)
        if released := release_free_heap():  # what loading freed, back to the system before serving
            log.info("returned %.0f MiB of freed heap to the system after loading", released / 2**20)

    def run_busy_loop(self) -> None:
        while True:
            idle = not self.scheduler.has_work
            idle_spill = idle and self.kv_disk is not None and self.kv_disk.has_idle_work()
            self.drain_inputs(block=idle and not idle_spill)
            if not self.running:
                return
            if idle_spill and not self.scheduler.has_work:  # nothing came: the cached blocks to disk meanwhile
                self.kv_disk.spill_idle()
            self.publish_deltas(self.end_overdue())
            batch = self.scheduler.schedule()
            if self.kv_disk is not None:  # what schedule() evicted, copied out before the step overwrites it
                self.kv_disk.spill_evicted()
            self.report_queue()
            deltas = self.step(batch) if batch else []
            self.publish_deltas(deltas + self.scheduler.take_errored())
            if self.kv_events is not None:  # what schedule() evicted and update() cached
                self.kv_events.publish(self.scheduler.block_manager.prefix_cache.take_events())

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
        for seq, lp in sampled.prompt_logprobs:  # sent with the request's first token
            seq.req.prompt_logprobs.append(lp)
            seq.req.num_prompt_scored = seq.prompt_scored.stop
        for seq, vector in sampled.embeddings:  # sent with its STOP delta, which update() makes
            seq.req.embedding = vector
        if sampled.logprobs is None:
            return self.scheduler.update(batch, sampled)
        # Read before update(): it appends the sampled ids, after which no seq needs a sample.
        # One sampled seq per request per step; a request aborted meanwhile gets no delta.
        logprobs_of = {id(s.req): lp for s, lp in zip(batch.sampled_seqs, sampled.logprobs)}
        deltas = self.scheduler.update(batch, sampled)
        for d in deltas:
            lp = logprobs_of.get(id(d.req))
            # A step with drafts may keep tokens past the one that ended the request.
            d.logprobs = lp if lp is None or lp.num_tokens == len(d.new_ids) else lp.head(len(d.new_ids))
        return deltas

    def end_overdue(self) -> list[TokenDelta]:
        """Requests past --request-timeout end now, with a TIMEOUT delta; their blocks are freed."""
        deltas = []
        for req_id in self.deadlines.expired(self.clock()):
            if (req := self.scheduler.abort(req_id)) is not None:
                req.finish = p.FinishReason.TIMEOUT
                deltas.append(TokenDelta(req, [], p.FinishReason.TIMEOUT))
        self.num_timed_out += len(deltas)
        return deltas

    def report_queue(self) -> None:
        """Hands the waiting queue as schedule() left it to admission control (the input thread)."""
        scheduler = self.scheduler
        num_waiting = scheduler.num_waiting
        # Seats free while nothing waits take newcomers next step; with requests waiting they
        # are held back by KV blocks or the token budget, and a newcomer would wait too.
        num_free_seats = 0 if num_waiting else scheduler.max_num_seqs - scheduler.num_running
        self.admission.update(self._num_taken, self._num_taken_tokens, num_waiting, scheduler.num_waiting_tokens,
                              num_free_seats)
        self._num_taken = self._num_taken_tokens = 0

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
        """One input; an exception while handling it fails that input alone (an ERROR delta, a
        500 LoRAResult) and the loop goes on: no request or admin call can stop the engine."""
        try:
            self._handle(item)
        except Exception:  # noqa: BLE001  (anything: a bug, or input nobody foresaw)
            log.exception("handling %s failed; failing it alone", _describe(item))
            try:
                self._fail_input(item)
            except Exception:  # noqa: BLE001
                log.exception("failing %s failed too", _describe(item))

    def _handle(self, item) -> None:
        if isinstance(item, EngineRequest):
            self.take_request(item)
        elif isinstance(item, p.Abort):
            for req_id in item.req_ids:
                self.deadlines.discard(req_id)
                if (req := self.scheduler.abort(req_id)) is not None:
                    self.num_aborted += 1
                    if item.notify:
                        self.publish_deltas([TokenDelta(req, [], p.FinishReason.CANCELLED)])
        elif isinstance(item, GrammarCompiled):
            self.publish_deltas(self.grammar_gate.compiled(item, self.scheduler))
        elif isinstance(item, p.StatsQuery):
            self.publish((item.worker_id, self.stats()))
        elif isinstance(item, p.Shutdown):
            self.running = False
        elif isinstance(item, p.AbortAll):
            self.abort_all(item.worker_id)
        elif isinstance(item, p.LoRAUpdate):
            self.publish((item.worker_id, msgspec.structs.replace(self.update_lora(item), data_parallel_rank=self.rank)))
        elif isinstance(item, p.CacheReset):
            num_blocks = self.scheduler.block_manager.reset_prefix_cache()
            log.info("prefix cache reset: %d blocks forgotten", num_blocks)
            self.publish((item.worker_id, p.CacheResetResult(self.rank, num_blocks)))

    def take_request(self, item: EngineRequest) -> None:
        item.arrival_s = item.arrival_s or self.clock()  # the input thread stamps it on receipt
        self._num_taken += 1
        self._num_taken_tokens += item.num_tokens
        if item.params.lora:
            lora = self.runner.lora
            adapter = None if lora is None else lora.adapters.get(item.params.lora)
            if adapter is None:
                log.warning("request %s: LoRA adapter %r is not loaded", item.req_id, item.params.lora)
                item.finish = p.FinishReason.NO_ADAPTER  # unloaded since the worker checked
                self.publish_deltas([TokenDelta(item, [], p.FinishReason.NO_ADAPTER)])
                return
            item.lora_load_id = adapter.load_id
        if not self._prompt_in_vocabulary(item.prompt_ids):
            # The API worker refuses these (a 400); in a step they would fail the whole batch.
            log.error("request %s: a prompt token id is outside the vocabulary; ending it", item.req_id)
            self.publish_deltas([self._errored(item)])
            return
        if item.params.structured is not None and (failed := self._attach_grammar(item)) is not None:
            self.publish_deltas([failed])
            return
        self.scheduler.add(item)
        if item.finish is None:  # not errored out in add()
            self.deadlines.add(item.req_id, item.arrival_s)

    def _prompt_in_vocabulary(self, prompt_ids: list[int]) -> bool:
        """Once per request, in C (min and max): the API worker has checked already."""
        vocab_size = self.runner.vocab_size
        return not prompt_ids or (min(prompt_ids) >= 0 and max(prompt_ids) < vocab_size)

    def _errored(self, req: EngineRequest) -> TokenDelta:
        req.finish = p.FinishReason.ERROR
        return TokenDelta(req, [], p.FinishReason.ERROR)

    def _fail_input(self, item) -> None:
        """What an input whose handling raised gets: its request ends with ERROR, its admin call a 500."""
        if isinstance(item, EngineRequest):
            self.deadlines.discard(item.req_id)
            if self.scheduler.holds(item):
                self.scheduler.abort(item.req_id)
            if item.finish is None or item.finish is p.FinishReason.ABORT:
                self.publish_deltas([self._errored(item)])
        elif isinstance(item, p.CacheReset):
            self.publish((item.worker_id, p.CacheResetResult(self.rank, -1)))  # -1: failed (a 500)
        elif isinstance(item, p.LoRAUpdate):
            self.publish((item.worker_id, p.LoRAResult(
                item.name, f"The engine failed to {'load' if item.path else 'unload'} LoRA adapter '{item.name}' "
                           "(see the server log); the engine goes on.", 500, self.rank)))

    def update_lora(self, item: p.LoRAUpdate) -> p.LoRAResult:
        """Loads or unloads an adapter between two steps; never one that a live request uses."""
        from rill.engine_proc.lora.adapter import AdapterError

        lora = self.runner.lora
        if lora is None:
            return p.LoRAResult(item.name, "LoRA adapters are not enabled (--enable-lora)", 400)
        replacing = bool(item.path) and item.load_inplace and item.name in lora.slots
        try:
            if item.path and not replacing:
                lora.load(item.name, item.path)
            elif not item.path and item.name not in lora.slots:
                return p.LoRAResult(item.name, f"The lora adapter '{item.name}' cannot be found.", 404)
            elif (users := sum(r.lora == item.name for r in self.scheduler.live_requests())):
                what = "replace it in place" if replacing else "unload it"
                return p.LoRAResult(item.name, f"The lora adapter '{item.name}' is in use by {users} requests; "
                                               f"{what} once they end.", 400)
            elif replacing:
                lora.load(item.name, item.path, inplace=True)
            else:
                lora.unload(item.name)
        except AdapterError as exc:
            return p.LoRAResult(item.name, str(exc), 400)
        return p.LoRAResult(item.name)

    def _attach_grammar(self, req: EngineRequest) -> TokenDelta | None:
        """Its grammar, or WAITING_FOR_GRAMMAR while it compiles; an ERROR delta if it cannot have one."""
        if self.grammar_gate is None:
            req.finish = p.FinishReason.ERROR
            return TokenDelta(req, [], p.FinishReason.ERROR)
        return self.grammar_gate.admit(req)

    def abort_all(self, worker_id: str = "") -> None:
        """Ends every request (or every one of API worker `worker_id`, which died) with an ABORT
        delta, which its worker turns into an error event."""
        doomed = [r.req_id for r in self.scheduler.live_requests() if not worker_id or r.worker_id == worker_id]
        reqs = [r for req_id in doomed if (r := self.scheduler.abort(req_id))]
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
            rss_bytes=resident_bytes(),
            weight_bytes=self.weight_bytes,
            num_preemptions=self.scheduler.num_preemptions,
            num_generated_tokens=self.num_generated_tokens,
            num_waiting_tokens=self.scheduler.num_waiting_tokens,
            num_rejected=self.admission.num_rejected,
            num_timed_out=self.num_timed_out,
            num_cached_blocks=blocks.prefix_cache.num_cached_blocks() if blocks.prefix_cache is not None else 0,
            data_parallel_rank=self.rank,
            lora_modules={name: a.path for name, a in lora.adapters.items()}
            if (lora := self.runner.lora) is not None else {},
            **spec_figures(self.scheduler.speculator),
            num_window_blocks=blocks.window.num_held(self.scheduler.live_requests()) if blocks.window else 0,
            by_priority={} if self.scheduler.priority is None else self.scheduler.priority_figures(),
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
            prompt_logprobs = None
            if req.prompt_logprobs and (d.new_ids or d.finish):
                prompt_logprobs = encode_logprobs(TokenLogprobs.concat(req.prompt_logprobs))
                req.prompt_logprobs = []
            delta = p.RequestDelta(
                req.req_id,
                len(d.new_ids),
                d.finish,
                num_prompt_tokens=req.num_prompt_tokens if first or d.finish else 0,
                num_cached_tokens=req.num_cached_tokens if first or d.finish else 0,
                logprobs=None if d.logprobs is None else encode_logprobs(d.logprobs),
                prompt_logprobs=prompt_logprobs,
                embedding=None if req.embedding is None or d.finish is None else req.embedding.astype("<f4").tobytes(),
                timings=None if d.finish is None else req.timings(now),
                prediction_tokens=(None if d.finish is None or req.prediction is None
                                   else [req.prediction.accepted, req.prediction.rejected]),
            )
            out.append((req.worker_id, delta, d.new_ids))
            self.num_generated_tokens += len(d.new_ids)
            if d.finish is not None:
                self.deadlines.discard(req.req_id)
                if d.finish not in _NOT_FINISHED:  # num_aborted, num_timed_out
                    self.num_finished += 1
        self.publish(out)


def _describe(item) -> str:
    """An input, for the log (never its prompt: it may be megabytes, and it is the user's)."""
    if isinstance(item, EngineRequest):
        return f"request {item.req_id}"
    if isinstance(item, p.LoRAUpdate):
        return f"LoRA update {item.name!r}"
    return type(item).__name__


def spec_figures(speculator) -> dict:
    """EngineStats' speculative-decoding counters ({} when it is off)."""
    if speculator is None:
        return {}
    s = speculator.stats
    return {"num_spec_drafts": s.num_drafts, "num_spec_draft_tokens": s.num_draft_tokens,
            "num_spec_accepted_tokens": s.num_accepted_tokens, "spec_accepted_per_pos": list(s.accepted_per_pos),
            "num_jump_forward_tokens": s.num_jump_forward_tokens, "num_jump_forward_accepted": s.num_jump_forward_accepted}
