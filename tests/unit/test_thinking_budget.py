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


def test_harmony_ends_its_own_thinking_with_end_and_is_cut_with_the_final_channels_header():
    """Harmony: the analysis ends at `<|end|>` (7), after which the model may open a call rather than the final
    answer; a budget spent writes `<|end|>` and the final channel's header (7, 8, 9)."""
    harmony = ThinkingBudget(4, END, OPEN, closed_ids=[7])
    assert run(harmony, [5, 20, 21, 7, 40, 41, 42, 43]) == [5, 20, 21, 7, 40, 41, 42, 43]  # a call may follow
    assert run(harmony, [5, 20, 21, 22, 23, 24, 25, 26]) == [5, 20, 21, 22, 7, 8, 9, 26]


def test_other_rows_keep_their_tokens_and_a_recomputed_request_carries_on():
    budgeted = EngineRequest("a", "w", [1], SamplingParams(max_tokens=9, thinking=ThinkingBudget(1, END)))
    plain = EngineRequest("b", "w", [1], SamplingParams(max_tokens=9))
    budgeted.output_ids = [20, 7]  # forced once before a preemption; the state was rebuilt since
    out = force_thinking_ends(torch.tensor([40, 41]), [ScheduledSeq(budgeted, 0, 1), ScheduledSeq(plain, 0, 1)])
    assert out.tolist() == [8, 41] and isinstance(budgeted.thinking, ThinkingState) and plain.thinking is None


def encode_words(text: str) -> list[int]:
    """A worker's encode_markers over a vocabulary of the markers' pieces."""
    vocab = {"<think>": 0, "</think>": 1, "<|channel|>analysis<|message|>": 2, "<|end|>": 3, "<|start|>assistant": 4,
             "<|channel|>final<|message|>": 5}
    out, rest = [], text
    while rest:
        piece = max((w for w in vocab if rest.startswith(w)), key=len)
        out.append(vocab[piece])
        rest = rest[len(piece):]
    return out


def test_budgets_from_the_request_fields():
    import pytest

    from rill.asgi.errors import APIError
    from rill.asgi.parsers.thinking_markers import HARMONY, THINK
    from rill.asgi.requests.schemas import ChatCompletionRequest
    from rill.asgi.requests.thinking import effort_template_kwargs, requested_tokens, thinking_budget

    def chat(**fields):
        return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **fields)

    assert requested_tokens(chat(thinking_token_budget=7, reasoning_effort="low")) == 7
    assert requested_tokens(chat(reasoning_effort="low")) == 1024 and requested_tokens(chat()) is None
    assert requested_tokens(chat(reasoning_effort="none")) == 0 and requested_tokens(chat(reasoning_effort="max")) is None
    assert thinking_budget(7, THINK["qwen3"], encode_words) == ThinkingBudget(7, [1], [0])
    assert thinking_budget(1024, THINK["deepseek_r1"], encode_words) == ThinkingBudget(1024, [1], [])
    assert thinking_budget(9, HARMONY, encode_words) == ThinkingBudget(9, [3, 4, 5], [2], closed_ids=[3])
    assert thinking_budget(2048, None, encode_words) is None  # Anthropic's budget_tokens: not enforced without one
    with pytest.raises(APIError) as err:
        thinking_budget(7, None, encode_words, param="thinking_token_budget")
    assert err.value.param == "thinking_token_budget" and "--reasoning-parser" in str(err.value)
    with pytest.raises(APIError) as err:
        requested_tokens(chat(reasoning_effort="extreme"))
    assert err.value.param == "reasoning_effort"
    assert effort_template_kwargs("none") == {"reasoning_effort": "none", "enable_thinking": False}
    assert effort_template_kwargs("high") == {"reasoning_effort": "high"} and effort_template_kwargs(None) == {}
