"""A request's client-sized sampling inputs (stop ids, logit_bias, the prompt for a repetition
penalty) are made tensors once, at its first sample, sparse or dense by size; and the scheduler
ends a request on a stop id through a set made once."""
from __future__ import annotations

import pytest
import torch

from rill.engine_proc.sample.prepared import SamplePrep
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.finish import finish_after
from rill.ipc.protocol import FinishReason
from tests.helpers.sampling import EOS_ID, make_seq

VOCAB = 300


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(0)) * 3


@pytest.mark.parametrize("num_stop_ids", [3, VOCAB - 10])  # sparse ids, and a dense mask
def test_min_tokens_holds_back_every_stop_id_and_eos(logits, num_stop_ids):
    top = logits[0].argsort(descending=True).tolist()
    stop_ids = [t for t in top if t != EOS_ID][:num_stop_ids] + [VOCAB + 5, -3]  # out of range: ignored
    seq = make_seq(num_generated=0, temperature=0.0, min_tokens=2, stop_token_ids=stop_ids)
    held = {*stop_ids, EOS_ID}
    [token] = Sampler([EOS_ID]).sample(logits, [seq])
    assert token not in held and token == next(t for t in top if t not in held)
    assert (seq.req.sample_prep.held_ids.dtype == torch.bool) == (num_stop_ids > VOCAB // 8)
    seq.req.output_ids = [9, 9]  # min_tokens reached: nothing is held back any more
    assert Sampler([EOS_ID]).sample(logits, [seq]) == [top[0]]


@pytest.mark.parametrize("num_biased", [4, VOCAB])  # sparse ids and values, and a dense vector
def test_logit_bias_adds_the_same_sparse_or_dense(logits, num_biased):
    bias = {i: float(i % 7) - 3.0 for i in range(num_biased)}
    seq = make_seq(temperature=0.0, logit_bias={**bias, VOCAB + 1: 100.0})  # out of range: ignored
    expected = logits[0].clone()
    for i, b in bias.items():
        expected[i] += b
    assert Sampler([EOS_ID]).sample(logits, [seq]) == [int(expected.argmax())]
    assert (seq.req.sample_prep.bias_ids is None) == (num_biased > VOCAB // 8)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_allowed_token_ids_are_all_that_is_sampled(logits, temperature):
    """vLLM's allowed_token_ids: every other token at -inf, logit_bias still added on the allowed ones."""
    top = logits[0].argsort(descending=True).tolist()
    allowed = top[-3:]  # the three least likely
    seq = make_seq(temperature=temperature, allowed_token_ids=allowed, logit_bias={allowed[0]: 5.0, top[0]: 100.0})
    sampler = Sampler([EOS_ID], seed=0)
    tokens = {sampler.sample(logits, [seq])[0] for _ in range(20)}
    assert tokens <= set(allowed)
    if temperature == 0.0:  # the bias on the allowed: its best
        expected = logits[0, allowed] + torch.tensor([5.0, 0.0, 0.0])
        assert tokens == {allowed[int(expected.argmax())]}
    assert seq.req.sample_prep.allowed_ids.tolist() == allowed  # ids, not a whole-vocabulary mask


def test_allowed_stop_ids_alone_outrank_min_tokens(logits):
    """min_tokens would hold back every allowed token: the allowed one is sampled, not one outside the list."""
    seq = make_seq(temperature=1.0, top_p=0.9, allowed_token_ids=[EOS_ID], min_tokens=3)
    assert Sampler([EOS_ID], seed=0).sample(logits, [seq]) == [EOS_ID]


def test_the_tensors_are_made_once_per_request(logits):
    seq = make_seq(temperature=0.0, min_tokens=5, stop_token_ids=[1, 2, 3], logit_bias={4: 1.0},
                   repetition_penalty=1.2)
    sampler = Sampler([EOS_ID])
    sampler.sample(logits, [seq])
    prep = seq.req.sample_prep
    assert isinstance(prep, SamplePrep) and prep.prompt_ids.tolist() == seq.req.prompt_ids
    seq.req.output_ids.append(7)
    sampler.sample(logits, [seq])
    assert seq.req.sample_prep is prep


def test_a_stop_id_ends_the_request_through_a_set():
    seq = make_seq(num_generated=1, stop_token_ids=list(range(1000, 5000)))
    req = seq.req
    assert req.stop_id_set == frozenset(range(1000, 5000))
    limits = dict(eos_token_ids=frozenset({EOS_ID}), max_model_len=10_000, cache_len=10_000)
    assert finish_after(req, 4999, **limits) is FinishReason.STOP
    assert finish_after(req, 999, **limits) is None
