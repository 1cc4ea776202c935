"""Thinking budgets in the sampler: the end marker written for a request whose thinking ran out of budget."""
from __future__ import annotations

import torch

from rill.engine_proc.sample.thinking import ThinkingState, force_thinking_ends
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams, ThinkingBudget

END, OPEN = [7, 8, 9], [5]  # `</think>` and `<think>` as token ids


def run(budget: ThinkingBudget, model_tokens: list[int]) -> list[int]:
    """The output when the model would write `model_tokens`, one a step, under `budget`."""
    req = EngineRequest("r", "w", [1, 2], SamplingParams(max_tokens=100, thinking=budget))
    for token in model_tokens:
        out = force_thinking_ends(torch.tensor([token]), [ScheduledSeq(req, 0, 1)])
        req.output_ids.append(int(out[0]))
    return req.output_ids


def test_the_end_marker_follows_the_budget_then_the_answer():
    assert run(ThinkingBudget(4, END), [20, 21, 22, 23, 24, 25, 26, 27, 28]) == [20, 21, 22, 23, 7, 8, 9, 27, 28]
    assert run(ThinkingBudget(0, END), [20, 21, 22, 23]) == [7, 8, 9, 23]  # no thinking at all


def test_a_model_that_ends_its_thinking_itself_is_left_alone():
    assert run(ThinkingBudget(5, END), [20, 7, 8, 9, 30, 31, 32, 33]) == [20, 7, 8, 9, 30, 31, 32, 33]


def test_a_marker_half_written_when_the_budget_runs_out_is_finished():
    assert run(ThinkingBudget(3, END), [20, 21, 7, 30, 31, 32, 33]) == [20, 21, 7, 8, 9, 32, 33]


def test_with_an_opening_only_an_output_that_opens_with_it_is_cut():
    assert run(ThinkingBudget(3, END, OPEN), [5, 20, 21, 22, 23, 24, 25]) == [5, 20, 21, 7, 8, 9, 25]
    assert run(ThinkingBudget(3, END, OPEN), [20, 21, 22, 23, 24]) == [20, 21, 22, 23, 24]  # thinking off


def test_other_rows_keep_their_tokens_and_a_recomputed_request_carries_on():
    budgeted = EngineRequest("a", "w", [1], SamplingParams(max_tokens=9, thinking=ThinkingBudget(1, END)))
    plain = EngineRequest("b", "w", [1], SamplingParams(max_tokens=9))
    budgeted.output_ids = [20, 7]  # forced once before a preemption; the state was rebuilt since
    out = force_thinking_ends(torch.tensor([40, 41]), [ScheduledSeq(budgeted, 0, 1), ScheduledSeq(plain, 0, 1)])
    assert out.tolist() == [8, 41] and isinstance(budgeted.thinking, ThinkingState) and plain.thinking is None


def state_with(parser: str | None):
    """What thinking_budget reads of a worker: the reasoning parser and a tokenizer knowing the markers."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"<think>": 0, "</think>": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return SimpleNamespace(settings=SimpleNamespace(http=SimpleNamespace(reasoning_parser=parser)), tokenizer=tokenizer)


def test_budgets_from_the_request_fields():
    import pytest

    from rill.asgi.errors import APIError
    from rill.asgi.requests.schemas import ChatCompletionRequest
    from rill.asgi.requests.thinking import chat_thinking, effort_template_kwargs, thinking_budget

    def chat(**fields):
        return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)

    assert chat_thinking(state_with("qwen3"), chat(thinking_token_budget=7)) == ThinkingBudget(7, [1], [0])
    assert chat_thinking(state_with("deepseek_r1"), chat(reasoning_effort="low")) == ThinkingBudget(1024, [1], [])
    assert chat_thinking(state_with("deepseek_r1"), chat(reasoning_effort="none")).max_tokens == 0
    assert chat_thinking(state_with("deepseek_r1"), chat(reasoning_effort="max")) is None  # no budget
    assert chat_thinking(state_with(None), chat(reasoning_effort="low")) is None  # the template's switch only
    assert thinking_budget(state_with(None), 2048) is None  # Anthropic's budget_tokens: not enforced without one
    with pytest.raises(APIError) as err:
        chat_thinking(state_with(None), chat(thinking_token_budget=7))
    assert err.value.param == "thinking_token_budget" and "--reasoning-parser" in str(err.value)
    with pytest.raises(APIError) as err:
        chat_thinking(state_with("qwen3"), chat(reasoning_effort="extreme"))
    assert err.value.param == "reasoning_effort"
    assert effort_template_kwargs("none") == {"reasoning_effort": "none", "enable_thinking": False}
    assert effort_template_kwargs("high") == {"reasoning_effort": "high"} and effort_template_kwargs(None) == {}
