"""The sampler: greedy, top-k/top-p/min-p, seeded determinism, the distribution, min_tokens, logprobs."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from rill.engine_proc.sample.sampler import Sampler, sample_tokens
from rill.engine_proc.sched.batch import ScheduledSeq
from tests.helpers.sampling import EOS_ID, make_seq


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(16, 300, generator=torch.Generator().manual_seed(0)) * 3


def test_greedy_is_argmax(logits):
    sampler = Sampler([EOS_ID], seed=0)
    seqs = [make_seq(temperature=0.0) for _ in range(len(logits))]
    assert sampler.sample(logits, seqs) == logits.argmax(dim=-1).tolist()


def test_greedy_on_bfloat16_logits_is_their_first_argmax_and_biases_apply_in_float32():
    """A plain greedy batch takes argmax of the model's bfloat16 logits as they are (ties: the first),
    and a row that changes its logits (logit_bias here) gets them in float32 first: a bias of 2**-10
    would round away in bfloat16 at 4.0."""
    logits = torch.zeros(8, 300, dtype=torch.bfloat16)
    logits[:, 7] = logits[:, 11] = 4.0
    sampler = Sampler([EOS_ID], seed=0)
    assert sampler.sample(logits, [make_seq(temperature=0.0) for _ in range(8)]) == [7] * 8
    assert logits.dtype == torch.bfloat16 and (logits[:, 11] == 4.0).all()  # the caller's, untouched
    biased = [make_seq(temperature=0.0, logit_bias={11: 2**-10})] + [make_seq(temperature=0.0) for _ in range(7)]
    assert sampler.sample(logits, biased) == [11] + [7] * 7
    assert (logits[:, 11] == 4.0).all()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_top_k_1_is_greedy(logits, temperature):
    sampler = Sampler([EOS_ID], seed=0)
    seqs = [make_seq(temperature=temperature, top_k=1) for _ in range(len(logits))]
    assert sampler.sample(logits, seqs) == logits.argmax(dim=-1).tolist()


def test_top_k_1_is_greedy_on_tied_logits():
    """bfloat16 logits tie often: top_k 1 still takes argmax's first, never the other tied token."""
    logits = torch.zeros(64, 300)
    logits[:, 7] = logits[:, 11] = 5.0  # two tokens tied at the top of every row
    sampler = Sampler([EOS_ID], seed=0)
    seqs = [make_seq(temperature=1.5, top_k=1) for _ in range(len(logits))]
    assert sampler.sample(logits, seqs) == [7] * len(logits)
    mixed = [make_seq(temperature=0.0), make_seq(temperature=1.5, top_k=1), make_seq(temperature=1.5)]
    assert sampler.sample(logits[:3], mixed)[:2] == [7, 7]


@pytest.mark.parametrize("top_k", [0, 50])
def test_tiny_top_p_is_greedy(logits, top_k):
    sampler = Sampler([EOS_ID], seed=0)
    seqs = [make_seq(temperature=2.0, top_p=1e-6, top_k=top_k) for _ in range(len(logits))]
    assert sampler.sample(logits, seqs) == logits.argmax(dim=-1).tolist()


def test_greedy_and_sampled_rows_mix(logits):
    sampler = Sampler([EOS_ID], seed=0)
    seqs = [make_seq(temperature=0.0 if i % 2 else 1.0, seed=i) for i in range(len(logits))]
    tokens = sampler.sample(logits, seqs)
    greedy = logits.argmax(dim=-1).tolist()
    assert tokens[1::2] == greedy[1::2]
    assert all(0 <= t < logits.shape[1] for t in tokens)


def _seeded_run(sampler: Sampler, row: torch.Tensor, seed: int, others: list[ScheduledSeq], num_steps: int) -> list[int]:
    """Tokens of one seeded request over `num_steps` steps, batched with `others`."""
    tokens = []
    for step in range(num_steps):
        seq = make_seq(num_generated=step, temperature=1.0, seed=seed)
        batch = [*others[:1], seq, *others[1:]]
        other_logits = torch.randn(len(others), row.shape[0])
        logits = torch.cat([other_logits[:1], row.unsqueeze(0), other_logits[1:]])
        tokens.append(sampler.sample(logits, batch)[1 if others else 0])
    return tokens


def test_same_seed_same_tokens_whatever_the_batch():
    row = torch.zeros(1000)  # flat: every token equally likely, so only the noise decides
    alone = _seeded_run(Sampler([EOS_ID]), row, seed=1234, others=[], num_steps=20)
    others = [make_seq(temperature=1.0), make_seq(temperature=0.7, seed=99, top_k=5), make_seq(temperature=0.0)]
    batched = _seeded_run(Sampler([EOS_ID]), row, seed=1234, others=others, num_steps=20)
    assert alone == batched
    different_seed = _seeded_run(Sampler([EOS_ID]), row, seed=1235, others=[], num_steps=20)
    assert different_seed != alone


def test_seeded_noise_depends_on_position_not_history():
    """A recomputed request (same seed, same number of outputs) draws the same token."""
    row = torch.zeros(1000)
    first = Sampler([EOS_ID]).sample(row.unsqueeze(0), [make_seq(num_generated=7, temperature=1.0, seed=5)])
    sampler = Sampler([EOS_ID])
    sampler.sample(row.unsqueeze(0), [make_seq(num_generated=3, temperature=1.0, seed=5)])
    again = sampler.sample(row.unsqueeze(0), [make_seq(num_generated=7, temperature=1.0, seed=5)])
    assert first == again


def _frequencies(sampler: Sampler, logits_row: torch.Tensor, num_samples: int, **params) -> torch.Tensor:
    seqs = [make_seq(seed=i, **params) for i in range(num_samples)]
    tokens = sampler.sample(logits_row.expand(num_samples, -1), seqs)
    return torch.bincount(torch.tensor(tokens), minlength=logits_row.shape[0]).float() / num_samples


def test_sampling_follows_softmax_with_temperature():
    # Seeded rows make the draw fixed: this cannot flake. With 20,000 samples the standard
    # error of each frequency is below 0.0036, so 0.015 is a > 4 sigma bound.
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    temperature = 0.7
    freqs = _frequencies(Sampler([EOS_ID]), row, 20_000, temperature=temperature)
    expected = torch.softmax(row / temperature, dim=0)
    assert torch.allclose(freqs, expected, atol=0.015), (freqs, expected)


def test_top_k_and_top_p_renormalise_over_the_kept_tokens():
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    probs = torch.softmax(row, dim=0)
    top3 = _frequencies(Sampler([EOS_ID]), row, 20_000, temperature=1.0, top_k=3)
    expected = torch.cat([probs[:3] / probs[:3].sum(), torch.zeros(2)])
    assert torch.allclose(top3, expected, atol=0.015), (top3, expected)
    # top_p = 0.8: tokens 0 and 1 hold 0.77 < 0.8, so token 2 is kept too; 3 and 4 go.
    top_p = _frequencies(Sampler([EOS_ID]), row, 20_000, temperature=1.0, top_p=0.8)
    assert torch.allclose(top_p, expected, atol=0.015), (top_p, expected)


def test_min_tokens_blocks_eos_and_stop_ids():
    row = torch.zeros(10)
    row[EOS_ID], row[7], row[4] = 10.0, 9.0, 8.0  # eos best, then stop id 7, then 4
    logits = row.expand(5, -1)
    seqs = [
        make_seq(num_generated=1, temperature=0.0, min_tokens=3),
        make_seq(num_generated=3, temperature=0.0, min_tokens=3),  # reached: eos allowed
        make_seq(num_generated=1, temperature=0.0, min_tokens=3, stop_token_ids=[7]),
        make_seq(num_generated=1, temperature=0.0, min_tokens=3, ignore_eos=True, stop_token_ids=[7]),
        make_seq(num_generated=1, temperature=1.0, top_k=1, min_tokens=3),
    ]
    before = logits.clone()
    assert Sampler([EOS_ID], seed=0).sample(logits, seqs) == [7, EOS_ID, 4, EOS_ID, 7]
    assert torch.equal(logits, before), "the caller's logits must not change"


def test_sample_tokens_twin_without_noise_is_argmax(logits):
    """With all-ones noise the race is plain argmax: the twin's filtering keeps the best token."""
    n = logits.shape[0]
    ones = torch.ones_like(logits)
    temperature = torch.full((n,), 0.8)
    expected = logits.argmax(dim=-1)
    assert torch.equal(sample_tokens(logits, temperature, None, None, None, ones), expected)
    top_k = torch.tensor([0, 1, 5, 300] * (n // 4))
    top_p = torch.tensor([1.0, 0.5, 0.9, 0.01] * (n // 4))
    min_p = torch.tensor([0.0, 0.3, 1.0, 0.05] * (n // 4))
    assert torch.equal(sample_tokens(logits, temperature, top_k, None, None, ones), expected)
    assert torch.equal(sample_tokens(logits, temperature, top_k, top_p, None, ones), expected)
    assert torch.equal(sample_tokens(logits, temperature, None, None, min_p, ones), expected)
    assert torch.equal(sample_tokens(logits, temperature, top_k, top_p, min_p, ones), expected)


# ---- min-p ------------------------------------------------------------------------------


def kept_tokens(row: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, min_p: float | None = None) -> set[int]:
    """The tokens the twin's filters keep for one row of logits, read off exactly.

    Row j of the batch gets near-zero noise on token j only: token j wins the race there
    whenever its probability is above 0, so the winners are exactly the kept tokens.
    """
    vocab_size = row.shape[0]
    noise = torch.ones(vocab_size, vocab_size).fill_diagonal_(1e-30)

    def column(value, dtype):
        return None if value is None else torch.full((vocab_size,), value, dtype=dtype)

    winners = sample_tokens(row.expand(vocab_size, -1), column(temperature, torch.float32),
                            column(top_k, torch.long), column(top_p, torch.float32),
                            column(min_p, torch.float32), noise)
    return {j for j in range(vocab_size) if winners[j] == j}


def test_min_p_keeps_exactly_the_tokens_at_or_above_the_threshold():
    # Probabilities relative to the most likely token, after temperature 0.5.
    ratios = torch.tensor([1.0, 0.5, 0.31, 0.29, 0.2, 0.05, 0.3001, 0.2999])
    row = 0.5 * ratios.log()
    assert kept_tokens(row, temperature=0.5, min_p=0.3) == {0, 1, 2, 6}
    assert kept_tokens(row, temperature=0.5) == set(range(8))
    assert kept_tokens(row, temperature=0.5, min_p=0.0) == set(range(8))
    assert kept_tokens(row, temperature=0.5, min_p=1.0) == {0}
    # Temperature first: at temperature 1 the same logits are flatter (ratios ** 0.5).
    assert kept_tokens(row, temperature=1.0, min_p=0.3) == {j for j in range(8) if ratios[j] ** 0.5 >= 0.3}
    # The same set through the top-k and the sorted (top-p) paths, and intersected with top-k.
    assert kept_tokens(row, temperature=0.5, top_k=0, min_p=0.3) == {0, 1, 2, 6}
    assert kept_tokens(row, temperature=0.5, top_p=1.0, min_p=0.3) == {0, 1, 2, 6}
    assert kept_tokens(row, temperature=0.5, top_k=3, min_p=0.3) == {0, 1, 2}
    assert kept_tokens(row, temperature=0.5, top_k=3, top_p=1.0, min_p=0.3) == {0, 1, 2}
    assert kept_tokens(row, temperature=0.5, top_k=2, min_p=0.6) == {0}


def test_min_p_runs_after_top_p():
    """vLLM V0's order, as documented on sample_tokens: top-p counts mass without min-p's cut.

    probs 0.4, 0.35, 0.25: top-p 0.5 keeps {0, 1} (only 0.4 ranks above token 1), then
    min-p 0.7 (threshold 0.28) keeps both. Min-p first would renormalise {0, 1} to 0.53, 0.47
    and top-p would then keep only token 0.
    """
    row = torch.tensor([0.4, 0.35, 0.25]).log()
    assert kept_tokens(row, top_p=0.5) == {0, 1}
    assert kept_tokens(row, min_p=0.7) == {0, 1}
    assert kept_tokens(row, top_p=0.5, min_p=0.7) == {0, 1}


def test_min_p_sampling_renormalises_over_the_kept_tokens():
    row = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    probs = torch.softmax(row, dim=0)  # relative to the first: 1, 0.37, 0.22, 0.14, 0.05
    freqs = _frequencies(Sampler([EOS_ID]), row, 20_000, temperature=1.0, min_p=0.2)
    expected = torch.cat([probs[:3] / probs[:3].sum(), torch.zeros(2)])
    assert torch.allclose(freqs, expected, atol=0.015), (freqs, expected)


# ---- logprobs ---------------------------------------------------------------------------


def test_logprobs_are_of_the_raw_logits_with_ranks_and_top_k(logits):
    raw = torch.log_softmax(logits, dim=-1)
    # Processing that changes the choice (penalties, min_tokens, temperature, filters) does not
    # change the logprobs: they are the model's own distribution (vLLM's raw_logprobs).
    seqs = [
        make_seq(temperature=0.0, logprobs=5),
        make_seq(temperature=0.9, seed=3, top_k=20, min_p=0.1, logprobs=20),
        make_seq(temperature=0.0),
        make_seq(num_generated=2, temperature=0.0, repetition_penalty=1.5, frequency_penalty=1.0, logprobs=0),
        make_seq(temperature=0.0, min_tokens=5, stop_token_ids=[int(logits[4].argmax())], logprobs=2),
    ] + [make_seq(temperature=1.0, seed=i, logprobs=3) for i in range(11)]
    out = Sampler([EOS_ID], seed=0).sample(logits, seqs)
    assert out.logprobs is not None and out.logprobs[2] is None
    for i, (token_id, lp) in enumerate(zip(out, out.logprobs)):
        if lp is None:
            continue
        k = seqs[i].req.params.logprobs
        top = raw[i].topk(k)
        assert lp.token_ids.shape == lp.logprobs.shape == (1, 1 + k) and lp.ranks.shape == (1,)
        assert lp.token_ids[0, 0] == token_id
        assert lp.logprobs[0, 0] == raw[i, token_id]
        assert lp.ranks[0] == 1 + int((raw[i] > raw[i, token_id]).sum())  # no ties in randn
        assert lp.token_ids[0, 1:].tolist() == top.indices.tolist()
        assert np.array_equal(lp.logprobs[0, 1:], top.values.numpy())
    assert out.logprobs[0].ranks[0] == 1  # greedy on raw logits
    assert out.logprobs[4].ranks[0] == 2  # its best token is held back by min_tokens
    assert out.logprobs[4].token_ids[0, 1] == logits[4].argmax()


def test_rank_counts_ties_as_vllm():
    row = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    out = Sampler([EOS_ID]).sample(row, [make_seq(temperature=0.0, logprobs=1)])
    assert out == [1] and out.logprobs[0].ranks[0] == 2  # token 2 ties with it: counted above


def test_no_logprobs_asked_none_computed(logits):
    out = Sampler([EOS_ID], seed=0).sample(logits, [make_seq(temperature=1.0) for _ in range(len(logits))])
    assert out.logprobs is None


# ---- all at once ------------------------------------------------------------------------

MIXED = [
    dict(temperature=0.0, repetition_penalty=1.3, logprobs=4),
    dict(temperature=0.8, seed=11, top_k=30),
    dict(temperature=1.2, seed=12, top_p=0.9, min_p=0.05, logprobs=7),
    dict(temperature=1.0, seed=13, min_p=0.2),
    dict(temperature=0.7, seed=14, presence_penalty=0.5, frequency_penalty=-0.3, logprobs=0),
    dict(temperature=1.0, seed=15, min_tokens=9, top_k=5, top_p=0.8),
    dict(temperature=0.0, frequency_penalty=2.0),
    dict(temperature=1.5, seed=16, top_k=2, min_p=0.5, repetition_penalty=0.8, logprobs=20),
]


def test_a_mixed_batch_gives_each_row_what_it_gets_alone():
    logits = torch.randn(len(MIXED), 300, generator=torch.Generator().manual_seed(1)) * 3
    for num_generated in (0, 4):
        seqs = [make_seq(num_generated=num_generated, **params) for params in MIXED]
        for s in seqs:  # outputs that penalties see: some of the row's best tokens
            s.req.output_ids = logits[0].topk(num_generated).indices.tolist()
        batched = Sampler([EOS_ID]).sample(logits, seqs)
        for i, seq in enumerate(seqs):
            alone = Sampler([EOS_ID]).sample(logits[i : i + 1], [seq])
            assert batched[i] == alone[0], (i, MIXED[i])
            if MIXED[i].get("logprobs") is None:
                assert batched.logprobs[i] is None
                continue
            a, b = alone.logprobs[0], batched.logprobs[i]
            assert np.array_equal(a.token_ids, b.token_ids) and np.array_equal(a.ranks, b.ranks)
            np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=1e-6)
