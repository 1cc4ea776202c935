"""Drafts from a smaller model of the same tokenizer (vLLM's method "draft_model"), greedy.

The draft model keeps a KV cache of its own with as many blocks as the target's, addressed by the
same block tables: a request's draft K/V lie in the same block ids and slots as its target K/V.
The scheduler reserves the slots (a placeholder per draft); before the target's step the runner
calls `fill(batch)`, which runs the draft model over each drafting request's tokens it has not
seen (its whole prompt the first time, then the one or two tokens since its last drafts) and then
one token at a time, taking its argmax each time, until every request has its drafts.

The draft K/V of rejected drafts lie past what the request keeps: `DraftState` counts the positions
whose draft K/V hold the request's own tokens, and the next `fill` computes from there. A request
recomputed after preemption has other blocks: `DraftState` notices, and it starts over.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from rill.engine_proc.attention.choice import create_attention_backend
from rill.engine_proc.attention.kv_cache import KVCache
from rill.engine_proc.model.loader import load_config, load_model
from rill.engine_proc.parallel.step_message import ReplicaBatch, ReplicaSeq
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.spec.config import SpeculativeConfig

log = logging.getLogger("rill.engine")
PLACEHOLDER = -1  # a draft slot the scheduler reserved, filled before the step runs


@dataclass(eq=False, slots=True)
class DraftState:
    num_computed: int  # positions [0, num_computed) hold draft K/V of the request's tokens
    num_preemptions: int  # the request's when they were computed (a recompute has other blocks)


class DraftModelProposer:
    drafts_later = True  # propose() reserves slots; fill() writes the drafts once the step's blocks are allocated

    def __init__(self, config: SpeculativeConfig, runner) -> None:
        self.num_speculative_tokens = config.num_speculative_tokens
        draft_config = load_config(config.model)
        if draft_config.vocab_size != runner.vocab_size:
            raise ValueError(f"--speculative-config: the draft model's vocabulary ({draft_config.vocab_size}) "
                             f"is not the target's ({runner.vocab_size}); it needs the same tokenizer")
        self.block_size = runner.block_size
        self.device = runner.device
        # The target's backend, not its batch-invariant form: the drafts are only proposals.
        self.attention = create_attention_backend(runner.attention_backend, runner.device, runner.dtype, self.block_size)
        self.model = load_model(config.model, draft_config, dtype=runner.dtype, device=runner.device,
                                attention=self.attention)
        self.kv_cache = KVCache(self.model.config, num_blocks=runner.kv_cache.num_blocks,
                                block_size=self.block_size, dtype=runner.dtype, device=runner.device)
        log.info("draft model %s: %d layers, its KV cache %.0f MiB", config.model,
                 draft_config.num_hidden_layers, self.kv_cache.num_bytes / 2**20)

    def propose(self, req: EngineRequest, max_drafts: int) -> list[int]:
        """Reserves the drafts' slots; `fill` computes them once the step's blocks are allocated."""
        return [PLACEHOLDER] * min(self.num_speculative_tokens, max_drafts)

    @torch.inference_mode()
    def fill(self, batch: Batch) -> None:
        """Replaces every placeholder draft of the batch by the draft model's greedy tokens."""
        seqs = [s for s in batch.seqs if s.draft_ids and s.draft_ids[0] == PLACEHOLDER]
        if not seqs:
            return
        # First pass: each request's tokens the draft model has not seen, up to its last one.
        steps = []
        for s in seqs:
            start = self._valid_prefix(s.req)
            tokens = s.req.token_ids(start, s.start_pos + 1)
            steps.append(ReplicaSeq(s.req, start, len(tokens), tokens, True, range(0)))
        next_ids = self._argmax(steps)
        for i in range(max(len(s.draft_ids) for s in seqs)):
            for s, token_id in zip([s for s in seqs if len(s.draft_ids) > i], next_ids):
                s.draft_ids[i] = token_id
            going = [s for s in seqs if len(s.draft_ids) > i + 1]
            if not going:
                break
            next_ids = self._argmax([ReplicaSeq(s.req, s.start_pos + 1 + i, 1, [s.draft_ids[i]], True, range(0))
                                     for s in going])
        for s in seqs:  # the draft K/V now cover its last token and every draft but the last
            s.req.spec_state = DraftState(s.start_pos + len(s.draft_ids), s.req.num_preemptions)

    def _valid_prefix(self, req: EngineRequest) -> int:
        state = req.spec_state
        if state is None or state.num_preemptions != req.num_preemptions:
            return 0
        # Drafts the target rejected lie past num_computed_tokens: their K/V are not the request's.
        return min(state.num_computed, req.num_computed_tokens)

    def _argmax(self, steps: list[ReplicaSeq]) -> list[int]:
        input_ids, positions, meta, logits_indices = self.attention.prepare(ReplicaBatch(steps))
        logits = self.model(input_ids, positions, meta, self.kv_cache, logits_indices)
        return logits.argmax(dim=-1).tolist()
