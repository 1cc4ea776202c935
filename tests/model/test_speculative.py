"""Speculative decoding through the real model: the same tokens as without it, greedy, seeded,
penalised and with logprobs, whatever the drafts; the drafts are verified in one step each."""
from __future__ import annotations

import numpy as np
import pytest
from transformers import AutoTokenizer

from rill.engine_proc.spec.build import build_speculator
from rill.engine_proc.spec.speculator import Speculator
from rill.ipc.logprobs import TokenLogprobs
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import MESSAGES
from tests.helpers.speculative import COPY, ngram, serve
from tests.helpers.truncated_model import write_truncated_model


@pytest.fixture(scope="module")
def chat_prompts(model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"])
            for m in [COPY, *MESSAGES]]


def test_greedy_output_is_the_same_and_copying_takes_fewer_steps(runner, chat_prompts):
    params = SamplingParams(max_tokens=48, temperature=0.0)
    plain, _, plain_steps = serve(runner, chat_prompts[:1], params)
    speculator = ngram()
    spec, _, spec_steps = serve(runner, chat_prompts[:1], params, speculator)
    assert spec == plain
    stats = speculator.stats
    assert stats.num_accepted_tokens > len(plain[0]) // 3, stats  # the model quotes its prompt
    assert spec_steps < plain_steps * 0.7, (spec_steps, plain_steps)


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.4),
    SamplingParams(max_tokens=40, temperature=0.9, top_p=0.95, seed=1234),
    SamplingParams(max_tokens=40, temperature=0.7, top_k=20, seed=7, presence_penalty=0.5, min_tokens=30),
], ids=["penalties", "seeded", "seeded-topk-min-tokens"])
def test_batched_output_is_the_same_with_drafts(runner, chat_prompts, params):
    """Several requests in one batch, some drafting and some not in each step: a seeded request's
    noise, its penalties and min_tokens see each draft row as if the drafts before it were output."""
    plain, _, _ = serve(runner, chat_prompts, params)
    speculator = ngram(3)
    spec, _, _ = serve(runner, chat_prompts, params, speculator)
    assert spec == plain
    assert speculator.stats.num_draft_tokens > 0


def test_logprobs_are_those_of_the_tokens_kept(runner, chat_prompts):
    params = SamplingParams(max_tokens=32, temperature=0.0, logprobs=3)
    plain, plain_lp, _ = serve(runner, chat_prompts[:2], params)
    speculator = ngram()
    spec, spec_lp, _ = serve(runner, chat_prompts[:2], params, speculator)
    assert spec == plain
    assert speculator.stats.num_accepted_tokens > 0
    for a, b, tokens in zip(plain_lp, spec_lp, plain):
        a, b = TokenLogprobs.concat(a), TokenLogprobs.concat(b)
        assert a.num_tokens == b.num_tokens == len(tokens)
        assert (a.token_ids == b.token_ids).all() and (a.ranks == b.ranks).all()
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=2e-4)


def draft_model(runner, model_dir, k=3) -> Speculator:
    """The shared runner with a draft model (the engine's runner builds its own from the config)."""
    from rill.engine_proc.spec.config import parse_speculative_config
    from rill.engine_proc.spec.draft_model import DraftModelProposer

    text = f'{{"method": "draft_model", "model": "{model_dir}", "num_speculative_tokens": {k}}}'
    runner.drafter = DraftModelProposer(parse_speculative_config(text), runner)
    speculator, _ = build_speculator(text, runner)
    return speculator


def test_the_target_as_its_own_draft_model_is_accepted_through_preemptions(runner, model_dir, chat_prompts):
    """The draft's K/V follow the request (catch-up after rejections, a fresh start after a
    preemption): with the target itself as the draft model nearly every draft is accepted, which a
    draft K/V out of step with the tokens would not be. Few blocks: requests are preempted."""
    params = SamplingParams(max_tokens=40, temperature=0.0, min_tokens=40)
    plain, _, plain_steps = serve(runner, chat_prompts, params, num_blocks=20)
    speculator = draft_model(runner, model_dir)
    try:
        spec, _, spec_steps = serve(runner, chat_prompts, params, speculator, num_blocks=20)
        assert serve.num_preemptions > 0
    finally:
        runner.drafter = None
    assert spec == plain
    stats = speculator.stats
    # min_tokens holds eos back in the target but not in the draft: a rare rejection.
    assert stats.num_accepted_tokens >= 0.85 * stats.num_draft_tokens, stats
    assert spec_steps < 0.6 * plain_steps


def test_a_truncated_draft_model_changes_nothing_but_the_steps(runner, model_dir, chat_prompts, tmp_path):
    draft_dir = write_truncated_model(model_dir, tmp_path / "draft", 4)
    params = SamplingParams(max_tokens=24, temperature=0.8, seed=5)
    plain, _, _ = serve(runner, chat_prompts, params)
    speculator = draft_model(runner, draft_dir, k=2)
    try:
        spec, _, _ = serve(runner, chat_prompts, params, speculator)
    finally:
        runner.drafter = None
    assert spec == plain
    assert speculator.stats.num_draft_tokens > 0
