"""Structural tags: a request's own (`structured_outputs.structural_tag`, both of its forms) and think-then-
constrain, where a reasoning parser's thinking comes before the request's constraint."""
from __future__ import annotations

import json

import pytest

from rill.asgi.errors import APIError
from rill.asgi.parsers.thinking_markers import HARMONY, THINK
from rill.asgi.requests.structural_tags import after_reasoning
from rill.asgi.requests.structured import _structured_outputs, checked
from rill.ipc.protocol import StructuredKind, StructuredSpec
from tests.helpers.grammar_checks import admits

QWEN3, R1 = THINK["qwen3"], THINK["deepseek_r1"]
SCHEMA = StructuredSpec(StructuredKind.JSON_SCHEMA, json.dumps(
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}))



def no_ids(text: str) -> list[int]:
    raise AssertionError("a <think> model's thinking is in the grammar: no ids")


@pytest.mark.parametrize("text,qwen3,deepseek_r1", [
    ('<think>maybe {"b": 1}</think>\n\n{"a": 5}', True, True),  # JSON in the thinking is free
    ('{"a": 5}', True, False),  # thinking off: qwen3's output need not think; R1's always does
    ('hmm, yes</think>{"a": 1}', False, True),  # R1's template opens the thinking in the prompt
    ('<think>x</think>{"b": 1}', False, False),  # the answer still follows the schema
    ('<think>x</think> no json', False, False),
    ('<think>unfinished {"a": 1}', False, False),
])
def test_the_constraint_starts_where_the_thinking_ends(text, qwen3, deepseek_r1):
    assert admits(SCHEMA, '{"a": 5}') and not admits(SCHEMA, '<think>x</think>{"a": 5}')  # alone: no thinking
    assert admits(after_reasoning(SCHEMA, QWEN3, no_ids), text) is qwen3
    assert admits(after_reasoning(SCHEMA, R1, no_ids), text) is deepseek_r1


@pytest.mark.parametrize("kind,value,answer", [
    (StructuredKind.REGEX, "(yes|no)", "no"), (StructuredKind.CHOICE, json.dumps(["A", "B"]), "B"),
    (StructuredKind.JSON_OBJECT, "", "{}"), (StructuredKind.GRAMMAR, 'root ::= "x" "y"', "xy"),
])
def test_every_kind_follows_the_thinking(kind, value, answer):
    spec = after_reasoning(StructuredSpec(kind, value), QWEN3, no_ids)
    assert admits(spec, f"<think>a b</think> {answer}") and admits(spec, answer)
    assert not admits(spec, "<think>a b</think> nonsense")


def test_a_constraint_that_spells_out_the_thinking_is_left_alone():
    regex = StructuredSpec(StructuredKind.REGEX, r"<think>[a-z]+</think>\n(yes|no)")
    assert after_reasoning(regex, QWEN3, no_ids) is regex and after_reasoning(SCHEMA, None, no_ids) is SCHEMA
    assert after_reasoning(None, QWEN3, no_ids) is None
    harmony = StructuredSpec(StructuredKind.REGEX, r"<\|channel\|>final<\|message\|>(yes|no)")
    assert after_reasoning(harmony, HARMONY, no_ids) is harmony


def test_harmony_s_grammar_starts_after_the_final_channel_s_header():
    """Harmony's markers are special tokens, which a grammar does not write: the engine starts the same grammar
    once the output has written the header's ids (engine_proc/grammar/matcher.py; tests/unit/test_grammar.py)."""
    spec = after_reasoning(SCHEMA, HARMONY, lambda text: [len(text)])
    assert (spec.kind, spec.value, spec.start_ids) == (SCHEMA.kind, SCHEMA.value, [len(HARMONY.answer)])


def test_a_requests_structural_tag_in_both_forms():
    new = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<f>"], "tags": [
        {"begin": "<f>", "content": {"type": "json_schema", "json_schema": {"type": "integer"}}, "end": "</f>"}]}}
    old = {"type": "structural_tag", "triggers": ["<f>"],
           "structures": [{"begin": "<f>", "schema": {"type": "integer"}, "end": "</f>"}]}
    specs = [checked(*_structured_outputs({"structural_tag": value})) for value in (new, old, json.dumps(old))]
    assert specs[0] == specs[1] == specs[2] and specs[0].kind is StructuredKind.STRUCTURAL_TAG
    assert admits(specs[0], "free text <f>12</f> more") and not admits(specs[0], "free <f>x</f>")
    assert admits(after_reasoning(specs[0], QWEN3, no_ids), "<think><f>x</think>then <f>3</f>")


@pytest.mark.parametrize("value,says", [
    ({"type": "structural_tag", "format": {"type": "nope"}}, "not a valid constraint"),
    ("[1", "must be a structural tag"), (7, "must be a structural tag"),
])
def test_bad_structural_tags_are_400s_naming_the_field(value, says):
    with pytest.raises(APIError) as err:
        checked(*_structured_outputs({"structural_tag": value}))
    assert err.value.status == 400 and err.value.param == "structured_outputs.structural_tag" and says in str(err.value)
