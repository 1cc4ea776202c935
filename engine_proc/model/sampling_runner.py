"""What the native and transformers runners share: one step's logits into sampled ids, embeddings and prompt logprobs."""
from __future__ import annotations

import torch

from rill.engine_proc.sample.prompt_logprobs import score_prompts
from rill.engine_proc.sample.sampler import Sampler, SamplerOutput
from rill.engine_proc.sched.batch import Batch
from rill.engine_proc.spec import verify as spec_verify


class SamplingRunner:
    """A runner whose `compute_logits(batch, eager, hidden_only)` gives the step's rows; `execute` samples them."""

    sampler: Sampler
    drafter = None  # a draft model that fills the draft slots before the step (the native runner's)
    verifies_drafts = False  # a step's decodes may carry drafts, each with its row (engine_proc/spec/verify.py)
    embeddings = False  # embedding requests too: rows pooled from the final hidden states
    lora = None  # --enable-lora's adapters (engine_proc/lora/manager.py): the native runner's
    sliding_window = None  # every layer's window, where the model has one (the paged transformers route's)
    layer_window = None  # (window, sliding layers) of a model with global layers too (the route's; window_tables.py)

    def compute_logits(self, batch: Batch, eager: bool = False, hidden_only: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def close(self) -> None:
        """Stop what the runner started (nothing here)."""

    def execute(self, batch: Batch) -> SamplerOutput:
        """Run the step; one sampled token id per seq of `batch.sampled_seqs`, in that order."""
        if not batch:
            return SamplerOutput([])
        if self.drafter is not None:  # the draft model's tokens into the slots the scheduler reserved
            self.drafter.fill(batch)
        sampled_seqs = batch.sampled_seqs
        scoring_seqs = batch.scoring_seqs
        embed_rows = [i for i, s in enumerate(sampled_seqs) if s.req.params.embed] if self.embeddings else []
        if not scoring_seqs and not embed_rows:  # with drafts, verified (engine_proc/spec/verify.py)
            return spec_verify.sample(self.sampler, self.compute_logits(batch), sampled_seqs)
        return self._execute_mixed(batch, sampled_seqs, scoring_seqs, embed_rows)

    def _execute_mixed(self, batch: Batch, sampled_seqs, scoring_seqs, embed_rows: list[int]) -> SamplerOutput:
        """A step with prompts to score or to embed: the sampled rows that are not embeddings,
        then the scoring rows, go through the head; the embedding rows' hidden states are pooled
        (the last token's, L2-normalised, as vLLM pools a decoder for embeddings)."""
        rows = self.compute_logits(batch, eager=True, hidden_only=bool(embed_rows))
        out = SamplerOutput([-1] * len(sampled_seqs))
        if embed_rows:  # an embedding is a prompt: one row each (only decodes have drafts)
            first_row = [0]
            for s in sampled_seqs:
                first_row.append(first_row[-1] + s.num_logits_rows)
            embed_at = [first_row[i] for i in embed_rows]
            vectors = torch.nn.functional.normalize(rows[embed_at].float(), dim=-1).cpu().numpy()
            out.embeddings = [(sampled_seqs[i], v) for i, v in zip(embed_rows, vectors)]
            skip = set(embed_at)
            keep = [i for i in range(rows.shape[0]) if i not in skip]
            rows = self.model.lm_logits(rows[keep]) if keep else rows[:0]
        generating = [i for i, s in enumerate(sampled_seqs) if not s.req.params.embed]
        num_rows = sum(sampled_seqs[i].num_logits_rows for i in generating)
        sampled = spec_verify.sample(self.sampler, rows[:num_rows], [sampled_seqs[i] for i in generating])
        for i, token_id in zip(generating, sampled):
            out[i] = token_id
        if sampled.spec_ids is not None:
            out.spec_ids = [[token_id] for token_id in out]
            for i, kept in zip(generating, sampled.spec_ids):
                out.spec_ids[i] = kept
        if sampled.logprobs is not None:
            out.logprobs = [None] * len(sampled_seqs)
            for i, lp in zip(generating, sampled.logprobs):
                out.logprobs[i] = lp
        if scoring_seqs:
            out.prompt_logprobs = list(zip(scoring_seqs, score_prompts(rows[num_rows:], scoring_seqs)))
        return out

