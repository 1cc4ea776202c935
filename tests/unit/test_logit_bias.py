"""logit_bias in the sampler, and a Submit's n choices per prompt with their seeds (engine side)."""
from __future__ import annotations

import queue

import pytest
import torch

from rill.engine_proc.io_threads import InputThread
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.admission import AdmissionControl
from rill.ipc import protocol as p
from tests.helpers.sampling import EOS_ID, make_seq


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 3


def test_bias_steers_greedy_and_sampled_rows(logits):
    target = int(logits[0].argmin())
    seqs = [make_seq(temperature=0.0, logit_bias={target: 100.0}),
            make_seq(temperature=1.0, seed=1, logit_bias={target: 100.0}),
            make_seq(temperature=0.0),
            make_seq(temperature=0.0, logit_bias={int(logits[3].argmax()): -100.0})]
    out = Sampler([EOS_ID], seed=0).sample(logits, seqs)
    assert out[0] == target and out[1] == target
    assert out[2] == int(logits[2].argmax())  # a row without a bias is untouched
    assert out[3] == int(logits[3].topk(2).indices[1])  # its best token is banned


def test_bias_adds_exactly_and_leaves_the_caller_logits_alone(logits):
    before = logits.clone()
    row = logits[:1]
    second = int(row[0].topk(2).indices[1])
    gap = float(row[0].max() - row[0, second])
    # A bias just past the gap moves greedy to the second token; just short of it does not.
    assert Sampler([EOS_ID]).sample(row, [make_seq(temperature=0.0, logit_bias={second: gap + 0.01})]) == [second]
    assert Sampler([EOS_ID]).sample(row, [make_seq(temperature=0.0, logit_bias={second: gap - 0.01})]) != [second]
    assert torch.equal(logits, before)


def test_logprobs_stay_raw_under_a_bias(logits):
    target = int(logits[0].argmin())
    out = Sampler([EOS_ID]).sample(logits[:1], [make_seq(temperature=0.0, logprobs=1, logit_bias={target: 100.0})])
    assert out == [target]
    assert out.logprobs[0].logprobs[0, 0] == torch.log_softmax(logits[0], -1)[target]
    assert out.logprobs[0].ranks[0] == 300


def test_no_bias_no_copy(logits, monkeypatch):
    import rill.engine_proc.sample.sampler as sampler_mod

    monkeypatch.setattr(sampler_mod, "add_logit_bias", lambda *a: pytest.fail("called without a bias"))
    Sampler([EOS_ID]).sample(logits, [make_seq(temperature=0.0) for _ in range(4)])


def _expand(msg: p.Submit) -> list:
    inputs: queue.SimpleQueue = queue.SimpleQueue()
    thread = InputThread.__new__(InputThread)  # its socket is not needed to judge a Submit
    thread.inputs, thread.admission, thread.publish = inputs, AdmissionControl(), None
    thread.submit(msg)
    out = []
    while not inputs.empty():
        out.append(inputs.get())
    return out


def test_submit_n_expands_each_prompt_into_seeded_choices():
    params = p.SamplingParams(max_tokens=4, seed=7)
    reqs = _expand(p.Submit(["a", "b", "c", "d", "e", "f"], "w", params, [[1, 2], [3]], n=3))
    assert [r.req_id for r in reqs] == ["a", "b", "c", "d", "e", "f"]
    assert [r.prompt_ids for r in reqs] == [[1, 2]] * 3 + [[3]] * 3
    assert [r.params.seed for r in reqs] == [7, 8, 9, 7, 8, 9]
    assert all(r.params.max_tokens == 4 for r in reqs)
    unseeded = _expand(p.Submit(["a", "b"], "w", p.SamplingParams(max_tokens=4), [[1]], n=2))
    assert [r.params.seed for r in unseeded] == [None, None]


def test_submit_n_survives_the_wire():
    msg = p.Submit(["a", "b"], "w", p.SamplingParams(max_tokens=4, logit_bias={5: -1.5}), [[1]], n=2)
    back = p.input_decoder.decode(p.input_encoder.encode(msg))
    assert back.n == 2 and back.params.logit_bias == {5: -1.5}
    one = p.Submit(["a"], "w", p.SamplingParams(max_tokens=4), [[1]])
    assert p.input_decoder.decode(p.input_encoder.encode(one)).n == 1
