"""Prompt logprobs through the real engine loop (EngineCore, Scheduler, the model runners) against
transformers' own log-softmax of the prompt: chunked prefill, prefix-cache hits, preemption."""
from __future__ import annotations

import queue

import numpy as np
import pytest
import torch

from rill.engine_proc.core import EngineCore
from rill.engine_proc.model.hf_runner import TransformersRunner
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc.logprobs import decode_logprobs
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BLOCK_SIZE, EOS_ID
from tests.helpers.runners import make_runner

TOP = 3
TEXT = ("The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step, "
        "and the river keeps flowing to the sea while the mountains stand still.")


@pytest.fixture(scope="module")
def prompt(model_dir) -> list[int]:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model_dir)(TEXT)["input_ids"]
    assert len(ids) > 2 * BLOCK_SIZE + 3  # spans several blocks and several chunks
    return ids


@pytest.fixture(scope="module")
def reference(hf_model, prompt) -> np.ndarray:
    """transformers' logprob of prompt token p given tokens [0, p), for p = 1..n-1 ([n-1, V])."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([prompt])).logits[0, :-1].float()
    return logits.log_softmax(dim=-1).numpy()


def run(runner, reqs: list[EngineRequest], *, budget: int = 24, num_blocks: int = 40,
        preemptions: list | None = None) -> dict[str, list]:
    """Every request to its end through EngineCore; its published deltas by request id."""
    published: list = []
    scheduler = Scheduler(BlockManager(num_blocks, BLOCK_SIZE), max_num_seqs=8, max_num_batched_tokens=budget,
                          max_model_len=2048, eos_token_ids=[EOS_ID])
    core = EngineCore(scheduler, runner, queue.SimpleQueue(), published.extend)
    for req in reqs:
        core.handle(req)
    while scheduler.has_work:
        core.publish_deltas(core.step(scheduler.schedule()))
    if preemptions is not None:
        preemptions.append(scheduler.num_preemptions)
    deltas: dict[str, list] = {}
    for _worker, delta, _ids in published:
        deltas.setdefault(delta.req_id, []).append(delta)
    return deltas


def scoring(req_id: str, prompt: list[int], num_top: int | None = TOP, max_tokens: int = 4) -> EngineRequest:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, prompt_logprobs=num_top)
    return EngineRequest(req_id, "w", list(prompt), params)


def check_against_reference(deltas: list, prompt: list[int], reference: np.ndarray, num_top: int = TOP) -> None:
    carrying = [d for d in deltas if d.prompt_logprobs is not None]
    assert len(carrying) == 1 and carrying[0] is deltas[0]  # once, with the first token
    lp = decode_logprobs(carrying[0].prompt_logprobs)
    assert lp.num_tokens == len(prompt) - 1 and lp.num_top == num_top
    assert lp.token_ids[:, 0].tolist() == prompt[1:]
    want = reference[np.arange(len(prompt) - 1), prompt[1:]]
    np.testing.assert_allclose(lp.logprobs[:, 0], want, atol=2e-4)
    want_top = np.argsort(-reference, axis=1)[:, :num_top]
    agree = (lp.token_ids[:, 1:] == want_top).mean()
    assert agree > 0.98, agree  # near-ties may swap
    want_ranks = (reference >= want[:, None]).sum(axis=1)
    assert (np.abs(lp.ranks - want_ranks) <= 1).all()


def test_chunked_prompt_logprobs_match_transformers(runner, prompt, reference):
    deltas = run(runner, [scoring("a", prompt)], budget=20)
    check_against_reference(deltas["a"], prompt, reference)


def test_a_prefix_cache_hit_does_not_hide_prompt_tokens(runner, prompt, reference):
    """The prompt is cached by a plain request first: the scoring request still computes every position."""
    plain = EngineRequest("plain", "w", list(prompt), SamplingParams(max_tokens=2, temperature=0.0))
    deltas = run(runner, [plain, scoring("a", prompt), scoring("b", prompt[: 2 * BLOCK_SIZE + 1], num_top=0)])
    assert deltas["a"][0].num_cached_tokens == 0
    check_against_reference(deltas["a"], prompt, reference)
    b = decode_logprobs(deltas["b"][0].prompt_logprobs)  # no top: the token's own logprob and rank
    assert b.num_top == 0 and b.num_tokens == 2 * BLOCK_SIZE
    np.testing.assert_allclose(b.logprobs[:, 0], reference[np.arange(2 * BLOCK_SIZE), prompt[1 : 2 * BLOCK_SIZE + 1]],
                               atol=2e-4)


def test_a_request_that_does_not_ask_gets_the_same_tokens_and_no_prompt_logprobs(runner, prompt):
    other = prompt[5:30]
    alone = run(runner, [EngineRequest("x", "w", list(other), SamplingParams(max_tokens=8, temperature=0.0))])
    beside = run(runner, [scoring("a", prompt), EngineRequest("x", "w", list(other),
                                                               SamplingParams(max_tokens=8, temperature=0.0))])
    assert all(d.prompt_logprobs is None for d in beside["x"])
    assert [d.num_new for d in beside["x"]] == [d.num_new for d in alone["x"]]


def test_a_preempted_scoring_request_sends_its_prompt_logprobs_once(runner, prompt, reference):
    """Too few blocks for both: the later request is preempted and recomputed; its logprobs
    are neither lost nor repeated."""
    blocks_each = -(-(len(prompt) + 24) // BLOCK_SIZE)
    preemptions: list[int] = []
    deltas = run(runner, [scoring("a", prompt, max_tokens=24), scoring("b", prompt, max_tokens=24)],
                 budget=64, num_blocks=blocks_each + 3, preemptions=preemptions)
    assert preemptions[0] > 0
    for req_id in "ab":
        check_against_reference(deltas[req_id], prompt, reference)


def test_the_transformers_runner_scores_prompts_too(model_dir, prompt, reference):
    hf = make_runner(model_dir, runner_class=TransformersRunner, dtype=torch.float32, num_kv_blocks=64, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID])
    deltas = run(hf, [scoring("a", prompt)], budget=20)
    check_against_reference(deltas["a"], prompt, reference)
