"""Jump-forward through the real model: what a structured output's grammar forces next (a JSON key, its quotes
and colon) is drafted and verified in the step, so the same greedy tokens come in fewer steps; a schema whose
forced text is slow to find drafts no more."""
from __future__ import annotations

import json
import queue

import pytest
from transformers import AutoTokenizer

from rill.engine_proc.grammar import matcher
from rill.engine_proc.grammar.compiler import GrammarCompiler
from rill.engine_proc.grammar.matcher import RequestGrammar
from rill.engine_proc.spec.ngram import NgramProposer
from rill.engine_proc.spec.speculator import Speculator
from rill.ipc.protocol import FinishReason, SamplingParams, StructuredKind, StructuredSpec
from tests.helpers.generation import EOS_ID
from tests.helpers.speculative import serve

ORDER = {"type": "object", "additionalProperties": False,
         "properties": {"customer_name": {"type": "string"}, "shipping_address": {"type": "string"},
                        "order_quantity": {"type": "integer"}, "is_priority_delivery": {"type": "boolean"}},
         "required": ["customer_name", "shipping_address", "order_quantity", "is_priority_delivery"]}
ASK = "Bob Smith orders 3 lamps, to be sent fast to 1 Main Street. Write the order as JSON."


def compile_spec(model_dir, spec: StructuredSpec):
    events: queue.SimpleQueue = queue.SimpleQueue()
    compiler = GrammarCompiler(model_dir, vocab_size=49152, stop_token_ids=[EOS_ID], notify=events.put)
    while (result := compiler.lookup(spec)) is None:
        events.get(timeout=120)
    return result


@pytest.fixture(scope="module")
def order_grammar(model_dir):
    return compile_spec(model_dir, StructuredSpec(StructuredKind.JSON_SCHEMA, json.dumps(ORDER)))


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"])
            for text in (ASK, "Alice Jones wants 12 chairs at 5 Oak Road, no hurry. The order as JSON, please.")]


def run(runner, prompts, grammar, speculator, params=None):
    grammars = []

    def make():
        grammars.append(RequestGrammar(grammar))
        return grammars[-1]

    params = params or SamplingParams(max_tokens=80, temperature=0.0)
    outputs, _, steps = serve(runner, prompts, params, speculator, grammar=make)
    return outputs, steps, grammars


def test_the_same_tokens_in_fewer_steps(runner, model_dir, prompts, order_grammar, monkeypatch):
    # The counts below measure the drafting, not the 2 ms cut-off (test_a_grammar_slow_to_jump_drafts_no_more): on a
    # loaded CI machine a forced text slow to find turned a grammar's drafting off and kept fewer than a fifth.
    monkeypatch.setattr(matcher, "JUMP_BUDGET_S", 1.0)
    off = Speculator(None, 0, jump_forward_tokens=0)
    plain, plain_steps, _ = run(runner, prompts, order_grammar, off)
    on = Speculator(None, 0)
    jumped, jumped_steps, grammars = run(runner, prompts, order_grammar, on)
    assert jumped == plain
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for ids, grammar in zip(jumped, grammars):  # each a whole object of the schema, ended by its grammar
        assert set(json.loads(tokenizer.decode(ids, skip_special_tokens=True))) == set(ORDER["properties"])
        assert grammar.finish is FinishReason.STOP
    assert off.stats.num_draft_tokens == 0
    stats = on.stats
    assert stats.num_jump_forward_tokens == stats.num_draft_tokens > 0
    assert stats.num_jump_forward_accepted > sum(map(len, plain)) // 5, stats
    assert jumped_steps < plain_steps * 0.85, (jumped_steps, plain_steps)


def test_other_drafts_are_cut_where_the_grammar_refuses_them(runner, prompts, order_grammar):
    """With jump-forward off, the n-gram proposer's drafts: only those the grammar accepts are scheduled, and the
    output is still the model's own under its grammar."""
    plain, _, _ = run(runner, prompts[:1], order_grammar, Speculator(None, 0, jump_forward_tokens=0))
    ngram = Speculator(NgramProposer(4, 1, 2), 4, jump_forward_tokens=0)
    proposed, _, _ = run(runner, prompts[:1], order_grammar, ngram)
    assert proposed == plain
    assert ngram.stats.num_draft_tokens > 0 and ngram.stats.num_jump_forward_tokens == 0


@pytest.mark.parametrize("params", [SamplingParams(max_tokens=40, temperature=0.8, seed=11),
                                    SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=1.3)])
def test_seeded_and_penalised_outputs_do_not_change(runner, prompts, order_grammar, params):
    plain, _, _ = run(runner, prompts[1:], order_grammar, Speculator(None, 0, jump_forward_tokens=0), params)
    on = Speculator(None, 0)
    jumped, _, _ = run(runner, prompts[1:], order_grammar, on, params)
    assert jumped == plain and on.stats.num_jump_forward_accepted > 0


def test_a_grammar_slow_to_jump_drafts_no_more(runner, model_dir, prompts, monkeypatch):
    """A schema's long constant: finding its forced text takes longer than the budget, so after the first
    try its request drafts nothing (and its output is the grammar's all the same)."""
    const = compile_spec(model_dir, StructuredSpec(StructuredKind.JSON_SCHEMA, json.dumps({"const": "lamp " * 200})))
    monkeypatch.setattr(matcher, "JUMP_BUDGET_S", 0.0)
    on = Speculator(None, 0)
    outputs, _, _ = run(runner, prompts[:1], const, on, SamplingParams(max_tokens=30, temperature=0.0))
    assert on.stats.num_draft_tokens == 8 and len(outputs[0]) == 30  # one step's drafts, then none
