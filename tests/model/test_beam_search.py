"""The beam search's rules (asgi/engine_link/beams.py) are transformers' own: driven by a model's logits,
beam by beam as the server drives it (each beam's top K next tokens a step), BeamSet answers what
`generate(num_beams=...)` answers for the same model (widths 2 and up: transformers searches greedily for 1), token for token and score for score: ends ranked
past the width, the early-stop heuristic, `early_stopping=True`, length penalties, `min_new_tokens`,
several end tokens, and the length limit."""
from __future__ import annotations

import pytest
import torch

from rill.asgi.engine_link.beams import BeamSet
from tests.helpers.tiny_models import save_tiny_model

PROMPT = [5, 17, 42, 9, 77]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return save_tiny_model("qwen2", tmp_path_factory.mktemp("beam-model"))


def next_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    return torch.log_softmax(logits, dim=-1)


def search(model, width, max_tokens, end_ids, **options) -> BeamSet:
    beams = BeamSet(width, max_tokens, frozenset(end_ids), **options)
    k = BeamSet.top_k(width, len(end_ids))
    while not beams.done:
        tops = []
        for beam in beams.live:
            top = next_logprobs(model, PROMPT + beam.tokens).topk(k)
            tops.append((top.indices.numpy(), top.values.numpy()))
        beams.advance(tops)
    return beams


def transformers_beams(model, width, max_tokens, end_ids, *, length_penalty=1.0, early_stopping=False,
                       min_tokens=0) -> list[tuple[list[int], float]]:
    out = model.generate(torch.tensor([PROMPT]), num_beams=width, num_return_sequences=width, do_sample=False,
                         max_new_tokens=max_tokens, min_new_tokens=min_tokens or None, length_penalty=length_penalty,
                         early_stopping=early_stopping, eos_token_id=list(end_ids), pad_token_id=end_ids[0],
                         return_dict_in_generate=True, output_scores=True)
    beams = []
    for seq, score in zip(out.sequences.tolist(), out.sequences_scores.tolist()):
        tokens = seq[len(PROMPT):]
        ends = [i for i, t in enumerate(tokens) if t in end_ids]
        beams.append((tokens[: ends[0] + 1] if ends else tokens, score))
    return beams


def common_ends(model, count: int) -> list[int]:
    """Tokens the model ranks high after the prompt and its greedy continuation: ends that beams meet."""
    ids, found = list(PROMPT), []
    for _ in range(8):
        top = next_logprobs(model, ids).topk(3).indices.tolist()
        found += [t for t in top[1:] if t not in found]
        ids.append(top[0])
    return found[:count]


@pytest.mark.parametrize("width,max_tokens,num_ends,options", [
    (3, 12, 1, {}),
    (4, 10, 1, {"length_penalty": 0.0}),
    (4, 10, 1, {"length_penalty": 2.0}),
    (3, 12, 2, {"length_penalty": -0.5}),
    (4, 12, 1, {"early_stopping": True}),
    (4, 12, 3, {"early_stopping": True}),
    (4, 10, 1, {"length_penalty": 0.0, "min_tokens": 3}),
    (5, 6, 0, {}),  # no end token (ignore_eos): every beam runs to the limit
], ids=["w3", "w4-lp0", "w4-lp2", "w3-two-ends-lp-neg", "w4-early", "w4-three-ends-early", "w4-lp0-min-tokens",
        "w5-no-ends"])
def test_the_search_answers_what_transformers_answers(model, width, max_tokens, num_ends, options):
    ends = common_ends(model, num_ends)
    beams = search(model, width, max_tokens, ends, **options)
    ours = [(b.tokens, b.score) for b in beams.best()]
    theirs = transformers_beams(model, width, max_tokens, ends or [model.config.vocab_size + 1], **options)
    assert [t for t, _ in ours] == [t for t, _ in theirs]
    assert [s for _, s in ours] == pytest.approx([s for _, s in theirs], abs=1e-4)
    reasons = {b.finish_reason for b in beams.best()}
    assert reasons <= {"stop", "length"} and all((b.tokens[-1] in ends) == (b.finish_reason == "stop")
                                                  for b in beams.best())


def test_the_cases_meet_ends_the_heuristic_and_min_tokens(model):
    """The cases above are not all runs to the limit: beams end on their end token, the early-stop heuristic
    ends a search before the limit, and min_tokens holds back ends that would come sooner."""
    ends = common_ends(model, 1)
    beams = search(model, 4, 10, ends, length_penalty=0.0)
    assert beams.step < 10 and all(b.finish_reason == "stop" for b in beams.best())
    assert min(len(b.tokens) for b in beams.best()) < 3
    held = search(model, 4, 10, ends, length_penalty=0.0, min_tokens=3)
    assert min(len(b.tokens) for b in held.best()) >= 3


def test_logprobs_name_each_token_with_its_rank_and_the_steps_top(model):
    ends = common_ends(model, 1)
    (best, *_) = search(model, 3, 6, ends).best()
    lp = best.logprobs()
    assert lp.token_ids[:, 0].tolist() == best.tokens
    assert lp.logprobs[:, 0].sum() == pytest.approx(best.logprob, abs=1e-4)
    for row_ids, row_lps, rank in zip(lp.token_ids, lp.logprobs, lp.ranks):
        top = row_ids[1:].tolist()
        assert row_lps[1:].tolist() == sorted(row_lps[1:].tolist(), reverse=True)
        assert rank == top.index(row_ids[0]) + 1 and row_lps[0] == row_lps[rank]
