"""Continuous batching: each step's tokens under a token budget, with chunked prefill and preemption."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from rill.engine_proc.sched.batch import Batch, ScheduledSeq, TokenDelta
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.finish import append_outputs
from rill.engine_proc.sched.priority import PriorityOrder, priority_figures
from rill.engine_proc.sched.request import EngineRequest, RequestState
from rill.ipc.protocol import FinishReason

_RUNNING = RequestState.RUNNING
_WAITING_FOR_GRAMMAR = RequestState.WAITING_FOR_GRAMMAR


class Scheduler:
    """A pure object: `add`, `schedule() -> Batch`, `update(batch, sampled) -> deltas`, `abort`.

    Call `take_errored()` once a step, also when the batch is empty: a request the engine can
    never serve (a prompt bigger than the whole KV cache or than `max_model_len`) finishes with
    `FinishReason.ERROR` in `add()`, outside any step, and its `TokenDelta(req, [], ERROR)`
    waits there; `has_work` stays true until it is taken. A request that outgrows the whole
    cache while generating finishes with ERROR in `update()`, in the delta of its last token.

    With the block manager's prefix cache on, admission starts a request after its longest
    cached prefix of full blocks, and `update()` enters the blocks each step fills.

    Structured outputs: a request added in state WAITING_FOR_GRAMMAR keeps its place in the
    queue but is passed over until `grammar_ready(req)`; it does not count as work, so the busy
    loop sleeps while only such requests wait. A request with a grammar finishes as soon as its
    grammar says (`req.grammar.finish`), whatever min_tokens and ignore_eos say.
    """

    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
        eos_token_ids: Sequence[int],
        watermark_blocks: int | None = None,
        speculator=None,
        priority: PriorityOrder | None = None,
    ) -> None:
        assert max_num_seqs >= 1 and max_num_batched_tokens >= 1 and max_model_len >= 1
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.eos_token_ids = frozenset(eos_token_ids)
        self.speculator = speculator  # speculative decoding's drafts (engine_proc/spec/speculator.py), or None
        # --scheduling-policy priority (engine_proc/sched/priority.py); None: first come, first served.
        self.priority = priority
        # Blocks a newcomer must leave free while others run, so that admitting it does not
        # at once preempt a running request that crosses into a new block next step (1%, as
        # vLLM's watermark, and at least one block).
        if watermark_blocks is None:
            watermark_blocks = max(1, block_manager.num_total_blocks() // 100)
        self.watermark_blocks = watermark_blocks
        # Tokens the whole cache holds for one request: no request may need more positions than this.
        self._cache_len = block_manager.num_tokens_alone(max_num_batched_tokens)
        # Both keyed by req_id, for O(1) abort. Waiting: the front is admitted first; a
        # preempted request goes back to the front. Running: in admission order, so the
        # last one is the most recently admitted, the first to preempt.
        self._waiting: OrderedDict[str, EngineRequest] = OrderedDict()
        self._running: dict[str, EngineRequest] = {}
        self._num_waiting_tokens = 0  # num_tokens of the waiting requests (fixed while they wait)
        self._num_waiting_for_grammar = 0  # of the waiting requests, those in WAITING_FOR_GRAMMAR
        # Requests errored out in add(), until take_errored() hands them out.
        self._errored_deltas: list[TokenDelta] = []
        # Prefix cache figures, over admissions (re-admissions after preemption included).
        self.num_prefix_queries_tokens = 0  # tokens of the requests looked up
        self.num_prefix_hit_tokens = 0  # of those, found in the cache
        self.num_preemptions = 0  # requests sent back to waiting for lack of blocks

    # ---- figures --------------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_waiting_tokens(self) -> int:
        """Tokens the waiting requests have to compute: prompts, and outputs of preempted ones."""
        return self._num_waiting_tokens

    @property
    def has_work(self) -> bool:
        return bool(self._running or len(self._waiting) > self._num_waiting_for_grammar or self._errored_deltas)

    def live_req_ids(self) -> list[str]:
        """Every request not finished yet: running, then waiting."""
        return [*self._running, *self._waiting]

    def live_requests(self) -> list[EngineRequest]:
        return [*self._running.values(), *self._waiting.values()]

    def priority_figures(self) -> dict[str, list[int]]:
        return priority_figures(self._running.values(), self._waiting.values())

    def holds(self, req: EngineRequest) -> bool:
        """True if this very request (not merely its id) is running or waiting here."""
        return self._running.get(req.req_id, self._waiting.get(req.req_id)) is req

    # ---- requests in and out ----------------------------------------------------------------

    def add(self, req: EngineRequest) -> None:
        """Queues `req` behind every waiting request, or errors it out if it can never run."""
        assert req.req_id not in self._waiting and req.req_id not in self._running, req.req_id
        assert req.state in (RequestState.WAITING, _WAITING_FOR_GRAMMAR) and not req.block_ids
        num_tokens = req.num_tokens
        # Checked once here: a request that fits now always fits later, since update()
        # finishes a request before it grows past the cache or max_model_len.
        # An image whose tokens attend both ways goes into one step (request.py chunk_end): the launcher refuses a
        # budget below one image's tokens, and this never lets one wait for ever.
        longest_image = max((end - start for start, end in req.image_runs), default=0)
        if (num_tokens == 0 or num_tokens > self.max_model_len or num_tokens > self._cache_len
                or longest_image > self.max_num_batched_tokens):
            req.state = RequestState.FINISHED
            req.finish = FinishReason.ERROR
            self._errored_deltas.append(TokenDelta(req, [], FinishReason.ERROR))
            return
        self._waiting[req.req_id] = req
        self._num_waiting_tokens += num_tokens
        if req.state is _WAITING_FOR_GRAMMAR:
            self._num_waiting_for_grammar += 1

    def grammar_ready(self, req: EngineRequest) -> None:
        """A request added in WAITING_FOR_GRAMMAR has its grammar now: it may be admitted."""
        assert req.state is _WAITING_FOR_GRAMMAR and req.req_id in self._waiting, req.req_id
        req.state = RequestState.WAITING
        self._num_waiting_for_grammar -= 1

    def take_errored(self) -> list[TokenDelta]:
        """The ERROR deltas of requests that add() found the engine can never serve."""
        if not self._errored_deltas:
            return []
        deltas = self._errored_deltas
        self._errored_deltas = []
        return deltas

    def abort(self, req_id: str) -> EngineRequest | None:
        """Drops a waiting or running request and frees its blocks; None if it is unknown."""
        req = self._running.pop(req_id, None)
        if req is None:
            req = self._waiting.pop(req_id, None)
            if req is None:
                return None
            self._num_waiting_tokens -= req.num_tokens
            if req.state is _WAITING_FOR_GRAMMAR:
                self._num_waiting_for_grammar -= 1
        self.block_manager.free(req)
        req.state = RequestState.FINISHED
        req.finish = FinishReason.ABORT
        return req

    # ---- one step ---------------------------------------------------------------------------

    def schedule(self) -> Batch:
        """Picks this step's tokens: running requests first, then waiting ones in FCFS order."""
        block_manager = self.block_manager
        budget = self.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []

        # Running requests in admission order. Decodes are not stalled by a long prompt:
        # a request can only be mid-prefill when its chunk used up the budget, so nothing
        # was admitted after it, and it is the last running request.
        order = self.priority
        if order is None:
            running = list(self._running.values())
        else:  # the worst last: the first to give way when blocks run out
            order.start_step()
            order.make_room(self._waiting.values(), self._running.values(), self._would_admit, self._preempt)
            running = order.best_first(self._running.values())
        num_live = len(running)  # running[num_live:] were preempted during this loop
        did_preempt = cut_short = False
        i = 0
        while i < num_live and budget > 0:
            req = running[i]
            start_pos = req.num_computed_tokens
            num_new_tokens = req.chunk_end(start_pos, budget) - start_pos
            if num_new_tokens < min(req.num_tokens - start_pos, budget):
                # Its chunk stops before an image it must take whole (request.py): no one is admitted behind it,
                # as when its chunk uses up the budget. An empty one waits for a step with room for the image.
                cut_short = True
                if not num_new_tokens:
                    i += 1
                    continue
            draft_ids = [] if self.speculator is None else self.speculator.drafts(
                req, start_pos, budget, num_live, min(self.max_model_len, self._cache_len + 1))
            num_new_tokens += len(draft_ids)
            num_new_blocks = block_manager.num_blocks_needed(req, start_pos + num_new_tokens)
            while not block_manager.can_allocate(num_new_blocks):
                # Out of blocks: recompute the most recently admitted request later. This
                # ends at `req` itself at the latest; and since add() and update() keep every
                # request within the whole cache, the oldest running request always fits,
                # so some request always progresses.
                num_live -= 1
                victim = running[num_live]
                self._preempt(victim)
                did_preempt = True
                if victim is req:
                    break
            else:
                if num_new_blocks:  # most decodes stay inside their last block
                    block_manager.allocate(req, start_pos + num_new_tokens)
                seqs.append(ScheduledSeq(req, start_pos, num_new_tokens, draft_ids))
                budget -= num_new_tokens
            i += 1

        # Admit no one in a step that had to preempt: blocks are short, and the preempted
        # requests (now at the front) would only be readmitted to be preempted again.
        if not did_preempt and not cut_short:
            self._admit(seqs, budget)
        return Batch(seqs)

    def _admit(self, seqs: list[ScheduledSeq], budget: int) -> None:
        block_manager = self.block_manager
        block_size = block_manager.block_size
        waiting = self._waiting
        running = self._running
        while budget > 0 and len(running) < self.max_num_seqs:
            req = self._next_waiting()
            if req is None:
                break
            # A preempted request recomputes prompt + output; its output_ids are kept, so it
            # samples only once it reaches its end, and nothing is lost or repeated. Cached
            # blocks stop strictly before the block of its last token: that token is always
            # computed (its logits are sampled), and this step's writes start on a block
            # edge, in blocks of its own, never in a shared one.
            cached_ids = block_manager.find_cached_blocks(req, req.max_cached_blocks(block_size))
            num_cached_tokens = len(cached_ids) * block_size
            end_pos = req.chunk_end(num_cached_tokens, budget)
            num_new_tokens = end_pos - num_cached_tokens
            if not num_new_tokens:  # an image it must take whole (request.py) waits for a step with room for it
                break
            # Cached blocks that sit free count against the free blocks like new ones.
            num_new_blocks = block_manager.num_blocks_to_admit(req, cached_ids, end_pos)
            # With nobody running there is nobody to starve, and a prompt the size of the
            # whole cache must still get in.
            num_reserved_blocks = self.watermark_blocks if running else 0
            if not block_manager.can_allocate(num_new_blocks + num_reserved_blocks):
                break  # FCFS: a smaller request behind it does not jump the queue
            del waiting[req.req_id]
            self._num_waiting_tokens -= req.num_tokens
            if cached_ids:
                block_manager.share(req, cached_ids)  # before allocate(), which may evict
            block_manager.allocate(req, end_pos)
            req.num_computed_tokens = num_cached_tokens
            # Usage reports what the prompt found on arrival, not what a re-admission after
            # preemption finds (mostly the request's own blocks).
            if req.num_preemptions == 0:
                req.num_cached_tokens = num_cached_tokens
            if block_manager.enable_prefix_caching:
                self.num_prefix_queries_tokens += req.num_tokens
                self.num_prefix_hit_tokens += num_cached_tokens
            req.state = _RUNNING
            running[req.req_id] = req
            seqs.append(ScheduledSeq(req, num_cached_tokens, num_new_tokens))
            # A chunk cut short before an image takes the rest of the budget: it stays the last one mid-prompt.
            budget = 0 if end_pos < min(req.num_tokens, num_cached_tokens + budget) else budget - num_new_tokens

    def _would_admit(self, req: EngineRequest) -> bool:
        """Would `req` get a seat and its first chunk's blocks now (the priority policy's question)?"""
        block_manager = self.block_manager
        block_size = block_manager.block_size
        cached_ids = block_manager.find_cached_blocks(req, req.max_cached_blocks(block_size))
        start = len(cached_ids) * block_size
        end_pos = req.chunk_end(start, self.max_num_batched_tokens)
        reserved = self.watermark_blocks if self._running else 0
        return len(self._running) < self.max_num_seqs and block_manager.can_allocate(
            block_manager.num_blocks_to_admit(req, cached_ids, end_pos) + reserved)

    def _next_waiting(self) -> EngineRequest | None:
        """The first waiting request that can be admitted: FCFS (or by priority), passing over grammars still
        compiling."""
        if self.priority is not None:
            return self.priority.first(self._waiting.values())
        if not self._num_waiting_for_grammar:
            return next(iter(self._waiting.values()), None)
        return next((r for r in self._waiting.values() if r.state is not _WAITING_FOR_GRAMMAR), None)

    def _preempt(self, req: EngineRequest) -> None:
        del self._running[req.req_id]
        self.block_manager.free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        req.state = RequestState.WAITING
        self._waiting[req.req_id] = req
        self._waiting.move_to_end(req.req_id, last=False)
        self._num_waiting_tokens += req.num_tokens

    def update(self, batch: Batch, sampled: list[int]) -> list[TokenDelta]:
        """Takes the step's sampled ids (one per `batch.sampled_seqs`, in order; in a step with
        drafts, `sampled.spec_ids` has every token each kept); returns deltas."""
        block_manager = self.block_manager
        spec_ids = getattr(sampled, "spec_ids", None)
        deltas: list[TokenDelta] = []
        num_sampled = 0
        for seq in batch.seqs:
            req = seq.req
            # Read before num_computed_tokens and output_ids change.
            needs_sample = seq.needs_sample
            if needs_sample:
                token_ids = spec_ids[num_sampled] if spec_ids is not None else [sampled[num_sampled]]
                num_sampled += 1
            if req.state is not _RUNNING:
                continue  # aborted after schedule(): abort()'s caller reports it
            assert seq.start_pos == req.num_computed_tokens, "update() twice for one batch"
            num_drafts = len(seq.draft_ids)
            # The drafts kept are computed; the KV slots of those rejected lie past
            # num_computed_tokens, and the next step writes over them.
            req.num_computed_tokens += seq.num_new_tokens - num_drafts
            if num_drafts:
                req.num_computed_tokens += len(token_ids) - 1
                self.speculator.record(req, seq.draft_ids, len(token_ids) - 1)
            if not needs_sample or req.params.embed:
                # Blocks this step filled become findable now, before the request may finish:
                # another request can share them while this one still runs.
                block_manager.after_step(req)
                if needs_sample:  # an embedding: pooled (the runner kept its vector), it ends here
                    self._finish_running(req, FinishReason.STOP)
                    deltas.append(TokenDelta(req, [], FinishReason.STOP))
                continue
            new_ids, finish = append_outputs(req, token_ids, eos_token_ids=self.eos_token_ids,
                                             max_model_len=self.max_model_len, cache_len=self._cache_len)
            block_manager.after_step(req)  # after the drafts kept joined the output
            if finish is not None:
                self._finish_running(req, finish)
            deltas.append(TokenDelta(req, new_ids, finish))
        assert num_sampled == len(sampled), "one sampled id per sampled seq"
        return deltas

    def _finish_running(self, req: EngineRequest, finish: FinishReason) -> None:
        del self._running[req.req_id]
        self.block_manager.free(req)
        req.state = RequestState.FINISHED
        req.finish = finish
