"""What the two scoring runners share (a classifier's, engine_proc/model/classifier_runner.py, and a decoder
reranker's, engine_proc/model/yes_no_runner.py): the `Runner` protocol's step, each finished prompt's scores
([score, logit] for one label) as its "embedding", and prompts run in length groups. A subclass writes `_score_group`."""
from __future__ import annotations

import numpy as np

from rill.engine_proc.model.encoder_runner import MAX_GROUP_TOKENS, PAD_BUDGET_TOKENS, length_groups
from rill.engine_proc.sample.sampler import SamplerOutput
from rill.engine_proc.sched.batch import Batch


class ScoringRunner:
    lora = None
    sliding_window = None
    layer_window = None
    embedding_dim = 0  # serves no embeddings

    def close(self) -> None:
        """Nothing to stop (the `Runner` protocol, engine_proc/model/runner_api.py)."""

    def execute(self, batch: Batch) -> SamplerOutput:
        """A placeholder token id (-1) per seq of `batch.sampled_seqs`, and `out.embeddings`:
        (seq, float32 scores: [score, logit] for one label) for each, in that order."""
        seqs = batch.sampled_seqs
        out = SamplerOutput([-1] * len(seqs))
        out.embeddings = list(zip(seqs, self.score([seq.req.prompt_ids for seq in seqs])))
        return out

    def score(self, prompts: list[list[int]]) -> list[np.ndarray]:
        """The scores of each prompt, in order; grouped by length for the forwards."""
        scores: list[np.ndarray | None] = [None] * len(prompts)
        for group in length_groups([len(p) for p in prompts], PAD_BUDGET_TOKENS, MAX_GROUP_TOKENS):
            for i, row in zip(group, self._score_group([prompts[i] for i in group])):
                scores[i] = row
        return scores

    def _score_group(self, prompts: list[list[int]]) -> np.ndarray:
        """[len(prompts), 2N] float32 (N labels): the activated scores, then the logits, in one forward."""
        raise NotImplementedError
