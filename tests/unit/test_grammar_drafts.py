"""A grammar's drafts with xgrammar over the bundled tokenizer: the tokens it forces, other drafts cut where it
refuses them, the bitmask rows that verify them, each leaving the matcher where it was; the speculator's caps."""
from __future__ import annotations

import json
import queue

import pytest
import torch
import xgrammar as xgr

from rill.engine_proc.grammar.compiler import GrammarCompiler
from rill.engine_proc.grammar.matcher import DraftRowMask, RequestGrammar
from rill.engine_proc.spec.speculator import Speculator
from rill.ipc.protocol import FinishReason, StructuredKind, StructuredSpec
from tests.helpers.scheduling import make_req

EOS_ID = 2
VOCAB = 49152
KEYS = {"type": "object", "additionalProperties": False, "required": ["customer_name", "order_quantity"],
        "properties": {"customer_name": {"type": "string"}, "order_quantity": {"type": "integer"}}}


@pytest.fixture(scope="module")
def compiled(model_dir):
    events: queue.SimpleQueue = queue.SimpleQueue()
    compiler = GrammarCompiler(model_dir, vocab_size=VOCAB, stop_token_ids=[EOS_ID], notify=events.put)

    def compile_spec(kind, value):
        spec = StructuredSpec(kind, value)
        while (result := compiler.lookup(spec)) is None:
            events.get(timeout=120)
        return result
    return compile_spec


@pytest.fixture(scope="module")
def ids(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def mask_of(grammar: RequestGrammar) -> torch.Tensor:
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    grammar.fill_bitmask(bitmask, 0)
    return bitmask[0].clone()


def grammar_after(compiled, text_ids: list[int]) -> RequestGrammar:
    grammar = RequestGrammar(compiled(StructuredKind.JSON_SCHEMA, json.dumps(KEYS)))
    for token in text_ids:
        grammar.accept(token)
    assert grammar.finish is None
    return grammar


def test_forced_ids_spell_the_key_and_leave_the_matcher(compiled, ids, tokenizer):
    grammar = grammar_after(compiled, ids('{"cust'))
    before = mask_of(grammar)
    forced = grammar.forced_ids(8)
    assert tokenizer.decode(forced) == "omer_name"  # its closing quote could still open a longer token
    assert torch.equal(mask_of(grammar), before)
    assert grammar.forced_ids(1) == forced[:1] and grammar.forced_ids(0) == []
    for token in forced:  # the grammar takes them
        grammar.accept(token)
    assert grammar.finish is None


def test_valid_prefix_cuts_at_a_refused_draft_or_a_stop_token(compiled, ids):
    grammar = grammar_after(compiled, ids('{"customer_name": "Bo'))
    before = mask_of(grammar)
    good, bad = ids('b", "order'), ids('b", "price')
    assert grammar.valid_prefix(good) == good
    kept = grammar.valid_prefix(bad)
    assert kept == bad[:len(kept)] and len(kept) < len(bad) and ids('b", "')[:len(kept)] == kept
    assert grammar.valid_prefix([EOS_ID, *good]) == []
    assert torch.equal(mask_of(grammar), before)


def test_draft_masks_are_the_masks_after_each_draft(compiled, ids):
    grammar = grammar_after(compiled, ids('{"'))
    drafts = grammar.forced_ids(8)
    assert drafts
    masks, usable = grammar.draft_masks(drafts, VOCAB)
    assert usable == len(drafts) and masks.shape[0] == len(drafts)
    walked = grammar_after(compiled, ids('{"'))
    for j, token in enumerate(drafts):
        walked.accept(token)
        assert torch.equal(masks[j], mask_of(walked)), j
    assert torch.equal(mask_of(grammar), mask_of(grammar_after(compiled, ids('{"'))))


def test_a_draft_that_completes_the_grammar_is_verified_by_the_stop_token(compiled, tokenizer):
    grammar = RequestGrammar(compiled(StructuredKind.REGEX, "ab"))
    a, b = (tokenizer.token_to_id(t) for t in ("a", "b"))
    grammar.accept(a)
    masks, usable = grammar.draft_masks([b], VOCAB)
    assert usable == 1 and DraftRowMask(masks[0]).finish is None
    allowed = ((masks[0].unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1).flatten().nonzero().flatten()
    assert allowed.tolist() == [EOS_ID]


class DeadEndMatcher:
    """xgrammar's matcher at the edge: it takes every token, and after `dead_after` of them allows nothing."""

    def __init__(self, dead_after: int) -> None:
        self.dead_after, self.accepted, self.rolled_back = dead_after, 0, 0

    def accept_token(self, token):
        self.accepted += 1
        return True

    def fill_next_token_bitmask(self, bitmask, row):
        if self.accepted >= self.dead_after:
            bitmask[row] = 0

    def is_terminated(self):
        return False

    def rollback(self, num):
        self.rolled_back += num
        self.accepted -= num


def test_a_dead_end_cuts_the_drafts_before_it(compiled):
    """After a draft that leaves nothing allowed, its row must not give a token: the drafts before it may be
    kept, it may not (its row is the token before the dead end, verified as any other), and nothing after it."""
    grammar = RequestGrammar(compiled(StructuredKind.REGEX, "ab"))
    grammar._matcher = DeadEndMatcher(dead_after=2)
    masks, usable = grammar.draft_masks([10, 11, 12, 13], VOCAB)
    assert usable == 1 and grammar._matcher.accepted == 0 and grammar._matcher.rolled_back == 2
    assert DraftRowMask(masks[0]).finish is None and DraftRowMask(masks[1]).finish is FinishReason.STOP


class FixedGrammar:
    """The speculator's view of a grammar: the forced tokens it would spell."""

    def __init__(self, forced):
        self.forced, self.asked, self.drafted, self.finish = forced, [], False, None

    def forced_ids(self, most):
        self.asked.append(most)
        return self.forced[:most]

    def valid_prefix(self, drafts):
        return drafts[:1]


@pytest.mark.parametrize("num_running, most", [(1, 8), (4, 8), (5, 6), (8, 4), (9, 0), (32, 0)])
def test_the_speculator_drafts_forced_tokens_fewer_as_steps_fill(num_running, most):
    req = make_req("a", max_tokens=100)
    req.output_ids.append(7)
    req.num_computed_tokens = req.num_tokens - 1
    req.grammar = FixedGrammar(list(range(100, 120)))
    drafts = Speculator(None, 0).drafts(req, req.num_computed_tokens, 512, num_running, 1024)
    assert drafts == list(range(100, 100 + most)) and req.grammar.drafted == bool(most)
    assert Speculator(None, 0, jump_forward_tokens=0).drafts(req, req.num_computed_tokens, 512, 1, 1024) == []


def test_a_thinking_budget_still_gets_no_drafts():
    from rill.ipc.protocol import ThinkingBudget

    req = make_req("a", max_tokens=100, thinking=ThinkingBudget(10, [5]))
    req.grammar = FixedGrammar([100, 101])
    assert Speculator(None, 0).drafts(req, req.num_tokens - 1, 512, 1, 1024) == []


def test_masks_slow_to_fill_stop_the_drafts(compiled, ids, monkeypatch):
    from rill.engine_proc.grammar import matcher

    grammar = grammar_after(compiled, ids('{"'))
    drafts = grammar.forced_ids(8)
    monkeypatch.setattr(matcher, "JUMP_BUDGET_S", 0.0)
    _, usable = grammar.draft_masks(drafts, VOCAB)
    assert usable == len(drafts)  # this step's drafts are verified all the same
    assert grammar.forced_ids(8) == []


def test_which_runners_get_a_speculator():
    """The native runner and the paged transformers route verify drafts (a speculator for predictions and
    jump-forward even without --speculative-config); a draft model needs the native one; a runner of one sequence
    at a time gets none, and a config stops its start."""
    from types import SimpleNamespace

    from rill.engine_proc.spec.build import build_speculator

    def runner(kind, verifies):
        return SimpleNamespace(info=SimpleNamespace(kind=kind), verifies_drafts=verifies)

    ngram = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
    paged = runner("transformers", True)
    assert build_speculator("", paged, 5)[0].jump_forward_tokens == 5
    assert build_speculator(ngram, paged)[0].num_speculative_tokens == 3
    with pytest.raises(ValueError, match="draft_model needs the native runner"):
        build_speculator('{"method": "draft_model", "model": "/m", "num_speculative_tokens": 2}', paged)
    one_at_a_time = runner("transformers", False)
    assert build_speculator("", one_at_a_time) == (None, "")
    with pytest.raises(ValueError, match="verifies no drafts"):
        build_speculator(ngram, one_at_a_time)
