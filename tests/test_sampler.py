"""The sampler: greedy, top-k/top-p, seeded determinism, the sampling distribution, min_tokens."""
from __future__ import annotations

import pytest
import torch

from engine_proc.batch import ScheduledSeq
from engine_proc.request import EngineRequest
from engine_proc.sampler import Sampler, sample_tokens
from ipc.protocol import SamplingParams

EOS_ID = 2


def make_seq(num_generated: int = 0, **params) -> ScheduledSeq:
    """A request about to sample its next token after `num_generated` outputs."""
    params.setdefault("max_tokens", 1000)
    req = EngineRequest("r", "w", prompt_ids=[5, 6, 7], params=SamplingParams(**params))
    req.output_ids = [9] * num_generated
    req.num_computed_tokens = req.num_tokens - 1
    return ScheduledSeq(req, start_pos=req.num_tokens - 1, num_new_tokens=1)


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(16, 300, generator=torch.Generator().manual_seed(0)) * 3


def test_greedy_is_argmax(logits):
    sampler = Sampler([EOS_ID], seed=0)
    seqs = [make_seq(temperature=0.0) for _ in range(len(logits))]
    assert sampler.sample(logits, seqs) == logits.argmax(dim=-1).tolist()


@pytest.mark.parametrize("temperature", [0.5, 1.0, 3.0])
def test_top_k_1_is_greedy(logits, temperature):
    sampler = Sampler([EOS_ID], seed=0)
    seqs = [make_seq(temperature=temperature, top_k=1) for _ in range(len(logits))]
    assert sampler.sample(logits, seqs) == logits.argmax(dim=-1).tolist()


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
    assert torch.equal(sample_tokens(logits, temperature, None, None, ones), expected)
    top_k = torch.tensor([0, 1, 5, 300] * (n // 4))
    top_p = torch.tensor([1.0, 0.5, 0.9, 0.01] * (n // 4))
    assert torch.equal(sample_tokens(logits, temperature, top_k, None, ones), expected)
    assert torch.equal(sample_tokens(logits, temperature, top_k, top_p, ones), expected)
