"""Repetition, frequency and presence penalties: which tokens they touch and by how much (vLLM's rules)."""
from __future__ import annotations

import torch

from rill.engine_proc.sample.penalties import penalize
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams

EOS_ID = 2
ROW = [2.0, -1.0, 0.5, -0.5, 3.0, 0.0, 1.0, -2.0]


def make_req(prompt_ids: list[int], output_ids: list[int], **params) -> EngineRequest:
    req = EngineRequest("r", "w", prompt_ids, SamplingParams(max_tokens=100, **params))
    req.output_ids = list(output_ids)
    return req


def make_seq(req: EngineRequest) -> ScheduledSeq:
    req.num_computed_tokens = req.num_tokens - 1
    return ScheduledSeq(req, start_pos=req.num_tokens - 1, num_new_tokens=1)


def vllm_reference(logits: torch.Tensor, reqs: list[EngineRequest]) -> torch.Tensor:
    """vLLM's dense formulation (model_executor/layers/utils.py apply_penalties), row by row."""
    out = logits.clone()
    vocab_size = logits.shape[1]
    for i, req in enumerate(reqs):
        p = req.params
        counts = torch.bincount(torch.tensor(req.output_ids, dtype=torch.long), minlength=vocab_size).float()
        prompt_mask = torch.bincount(torch.tensor(req.prompt_ids, dtype=torch.long), minlength=vocab_size) > 0
        factor = torch.where(prompt_mask | (counts > 0), p.repetition_penalty, 1.0)
        row = torch.where(out[i] > 0, out[i] / factor, out[i] * factor)
        out[i] = row - p.frequency_penalty * counts - p.presence_penalty * (counts > 0)
    return out


def test_matches_vllms_dense_formula_on_random_rows():
    gen = torch.Generator().manual_seed(0)
    vocab_size = 40
    logits = torch.randn(8, vocab_size, generator=gen) * 3
    reqs = []
    for i in range(8):
        prompt = torch.randint(0, vocab_size, (1 + 7 * i,), generator=gen).tolist()
        output = torch.randint(0, vocab_size // 2, (3 * i,), generator=gen).tolist()  # repeats
        reqs.append(make_req(prompt, output, repetition_penalty=[1.0, 1.3, 0.7][i % 3],
                             frequency_penalty=[0.0, 0.4, -0.6, 1.1][i % 4],
                             presence_penalty=[0.3, 0.0, -1.5][i % 3]))
    expected = vllm_reference(logits, reqs)
    assert torch.allclose(penalize(logits, reqs), expected, rtol=1e-6, atol=1e-6)
    for i in range(8):  # one row alone gives the same row
        alone = penalize(logits[i : i + 1], reqs[i : i + 1])
        assert torch.allclose(alone, expected[i : i + 1], rtol=1e-6, atol=1e-6)


def test_each_penalty_changes_exactly_its_tokens_by_the_right_amount():
    logits = torch.tensor([ROW])
    # Prompt: tokens 0 and 1. Output: token 2 twice, token 3 once, token 1 once.
    req = make_req([0, 1], [2, 3, 2, 1], repetition_penalty=2.0)
    assert penalize(logits, [req]).tolist() == [[
        1.0,  # prompt, positive: divided
        -2.0,  # prompt and output, negative: multiplied
        0.25, -1.0,  # output only
        3.0, 0.0, 1.0, -2.0,  # never seen: untouched
    ]]
    # Frequency and presence look at the output only: prompt-only token 0 keeps its logit.
    req = make_req([0, 1], [2, 3, 2, 1], frequency_penalty=0.5, presence_penalty=0.25)
    assert penalize(logits, [req]).tolist() == [[
        2.0,
        -1.0 - 0.5 - 0.25,
        0.5 - 2 * 0.5 - 0.25,
        -0.5 - 0.5 - 0.25,
        3.0, 0.0, 1.0, -2.0,
    ]]
    # All three: repetition first, then frequency and presence on the divided logit.
    req = make_req([0, 1], [2, 3, 2, 1], repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    assert penalize(logits, [req]).tolist() == [[1.0, -2.75, -1.0, -1.75, 3.0, 0.0, 1.0, -2.0]]


def test_negative_penalties_encourage_and_rows_keep_their_own_values():
    logits = torch.tensor([ROW, ROW])
    reqs = [
        make_req([4], [6, 6], frequency_penalty=-1.0, presence_penalty=-0.5),
        make_req([4, 7], [0], repetition_penalty=0.5),  # < 1 favours seen tokens
    ]
    out = penalize(logits, reqs)
    expected = torch.tensor([ROW, ROW])
    expected[0, 6] = 1.0 + 2 * 1.0 + 0.5
    expected[1, 4], expected[1, 7], expected[1, 0] = 6.0, -1.0, 4.0
    assert torch.equal(out, expected)
    assert torch.equal(logits, torch.tensor([ROW, ROW])), "penalize returns a new tensor"


def test_a_row_with_no_outputs_yet_is_unchanged_by_frequency_and_presence():
    logits = torch.tensor([ROW, ROW])
    reqs = [make_req([4, 6], [], frequency_penalty=2.0, presence_penalty=2.0),
            make_req([4], [6], presence_penalty=1.0)]
    expected = torch.tensor([ROW, ROW])
    expected[1, 6] = 0.0
    assert torch.equal(penalize(logits, reqs), expected)


def test_greedy_rows_are_penalised_and_others_are_not():
    """Token 4 is every row's best; row 0 generated it three times and its penalty changes the pick."""
    row = torch.tensor(ROW)
    logits = torch.stack([row, row, row, row])
    seqs = [
        make_seq(make_req([5], [4, 4, 4], temperature=0.0, frequency_penalty=0.5)),  # 3 - 1.5 < 2
        make_seq(make_req([5], [4, 4, 4], temperature=0.0)),  # no penalty: still 4
        make_seq(make_req([4], [], temperature=0.0, repetition_penalty=2.0)),  # 3 / 2 < 2
        make_seq(make_req([5], [4], temperature=0.0, presence_penalty=0.9)),  # 2.1 > 2: still 4
    ]
    out = Sampler([EOS_ID], seed=0).sample(logits, seqs)
    assert out == [0, 4, 0, 4]
    assert torch.equal(logits, torch.stack([row, row, row, row])), "the caller's logits must not change"


def test_penalties_compose_with_min_tokens():
    row = torch.tensor(ROW)
    row[EOS_ID] = 5.0  # eos best, held back by min_tokens; then 4, penalised below 0
    seq = make_seq(make_req([5], [4], temperature=0.0, min_tokens=3, frequency_penalty=2.0))
    assert Sampler([EOS_ID]).sample(row.unsqueeze(0), [seq]) == [0]
