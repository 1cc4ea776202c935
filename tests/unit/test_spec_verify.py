"""Verification keeps the target's distribution: a chi-square test over many unseeded draws."""
from __future__ import annotations

import numpy as np
import torch

from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.spec.verify import accepted, sample
from rill.ipc.protocol import SamplingParams

VOCAB = 8
# Row 0: the distribution of the token after the prompt; row 1: after the draft d0 = 2.
P0 = np.array([0.05, 0.10, 0.30, 0.05, 0.20, 0.10, 0.15, 0.05])
P1 = np.array([0.25, 0.05, 0.05, 0.30, 0.05, 0.10, 0.10, 0.10])
CHI2_DF7_999 = 24.32  # the 99.9% quantile of chi-square with 7 degrees of freedom


def chi2(counts: np.ndarray, probs: np.ndarray) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def draws(num: int, drafts: list[int]) -> list[list[int]]:
    sampler = Sampler([VOCAB + 5], seed=0)  # an eos outside the vocabulary: never held back
    params = SamplingParams(max_tokens=10, temperature=1.0)
    seqs = [ScheduledSeq(EngineRequest(f"r{i}", "w", [1, 2, 3], params), 2, 1 + len(drafts), list(drafts))
            for i in range(num)]
    rows = np.log(np.stack([P0, P1, P0][: 1 + len(drafts)]))
    logits = torch.tensor(np.tile(rows, (num, 1)), dtype=torch.float32)
    return sample(sampler, logits, seqs).spec_ids


def test_kept_tokens_are_distributed_as_the_target():
    out = draws(6000, [2, 3])
    first = np.bincount([kept[0] for kept in out], minlength=VOCAB)
    assert chi2(first, P0) < CHI2_DF7_999, first  # the draft 2 accepted with probability P0[2], else P0 without it
    accept_rate = np.mean([kept[0] == 2 for kept in out])
    assert abs(accept_rate - P0[2]) < 0.03
    # Given the draft was kept, the next token is drawn from row 1, whatever the second draft.
    second = np.bincount([kept[1] for kept in out if kept[0] == 2], minlength=VOCAB)
    assert chi2(second, P1) < CHI2_DF7_999, second
    assert all(len(kept) == 1 for kept in out if kept[0] != 2)  # a rejection ends the step's tokens
    assert all(len(kept) == 3 for kept in out if kept[:2] == [2, 3])  # both kept: a bonus token


def test_the_test_fails_for_a_verifier_that_trusts_its_drafts():
    """What the chi-square test rejects: keeping every draft skews the first token to the draft."""
    out = draws(6000, [2])
    trusted = np.bincount([2 for _ in out], minlength=VOCAB) + np.bincount([k[0] for k in out], minlength=VOCAB)
    assert chi2(trusted, P0) > CHI2_DF7_999


def test_accepted_keeps_drafts_while_they_match():
    assert accepted([5, 6, 7], [5, 6, 9, 4]) == [5, 6, 9]
    assert accepted([5, 6], [5, 6, 8]) == [5, 6, 8]
    assert accepted([5], [1, 2]) == [1]
