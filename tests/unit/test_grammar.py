"""Structured outputs in the engine: specs to grammars, the compile cache, bitmasks, the sampler, the gate."""
from __future__ import annotations

import json
import queue

import pytest
import torch
import xgrammar as xgr

from rill.engine_proc.core import EngineCore
from rill.engine_proc.grammar.bitmask import GrammarMasker, apply_token_bitmask, apply_token_bitmask_kernel
from rill.engine_proc.grammar.compiler import GrammarCompiled, GrammarCompiler
from rill.engine_proc.grammar.gate import GrammarGate
from rill.engine_proc.grammar.matcher import RequestGrammar
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.batch import ScheduledSeq
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest, RequestState
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc.grammar_spec import GrammarError, to_grammar
from rill.ipc.protocol import FinishReason, SamplingParams, StructuredKind, StructuredSpec

EOS_ID = 2
VOCAB = 49152  # SmolLM2's tokenizer and logits
CHOICE = StructuredSpec(StructuredKind.CHOICE, json.dumps(["yes", "no"]))


@pytest.fixture(scope="module")
def tokenizer_ids(tokenizer):
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def compiler(model_dir):
    events: queue.SimpleQueue = queue.SimpleQueue()
    compiler = GrammarCompiler(model_dir, vocab_size=VOCAB, stop_token_ids=[EOS_ID], notify=events.put)
    compiler.events = events
    return compiler


def compiled(compiler: GrammarCompiler, spec: StructuredSpec):
    """The spec's compile result, waiting for the background thread if need be."""
    result = compiler.lookup(spec)
    while result is None:
        compiler.events.get(timeout=120)
        result = compiler.lookup(spec)
    return result


def accepts(compiler, spec: StructuredSpec, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled(compiler, spec))
    return matcher.accept_string(text) and matcher.accept_token(EOS_ID) and matcher.is_terminated()


# ---- specs and the compile cache ------------------------------------------------------------


@pytest.mark.parametrize("kind,value", [
    (StructuredKind.JSON_SCHEMA, '{"type": "nope"}'), (StructuredKind.JSON_SCHEMA, "not json"),
    (StructuredKind.REGEX, "[a-"), (StructuredKind.GRAMMAR, "root ::= undefined_rule"),
])
def test_invalid_specs_raise_a_clean_grammar_error(kind, value):
    with pytest.raises(GrammarError) as info:
        to_grammar(StructuredSpec(kind, value))
    assert not str(info.value).startswith("[") and "\n" not in str(info.value)  # no C++ log prefix


def test_each_kind_accepts_what_it_should(compiler):
    schema = StructuredSpec(StructuredKind.JSON_SCHEMA, json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}))
    assert accepts(compiler, schema, '{"n": 3}') and not accepts(compiler, schema, '{"m": 3}')
    obj = StructuredSpec(StructuredKind.JSON_OBJECT, "")
    assert accepts(compiler, obj, '{"a": [1, {"b": null}]}')
    assert not accepts(compiler, obj, "[1]")  # json_object means an object, not any JSON value
    regex = StructuredSpec(StructuredKind.REGEX, r"\d{3}-[a-z]+")
    assert accepts(compiler, regex, "123-abc") and not accepts(compiler, regex, "12-abc")
    grammar = StructuredSpec(StructuredKind.GRAMMAR, 'root ::= "a" root | "b"')
    assert accepts(compiler, grammar, "aaab") and not accepts(compiler, grammar, "aba")


def test_choices_are_escaped(compiler):
    choices = ['say "hi"', "back\\slash", "new\nline", "é ü 中", ""]
    spec = StructuredSpec(StructuredKind.CHOICE, json.dumps(choices))
    assert all(accepts(compiler, spec, c) for c in choices)
    assert not accepts(compiler, spec, "say hi") and not accepts(compiler, spec, "é")


def test_cache_compiles_once_and_reports_failures(model_dir):
    events: queue.SimpleQueue = queue.SimpleQueue()
    comp = GrammarCompiler(model_dir, vocab_size=VOCAB, stop_token_ids=[EOS_ID], notify=events.put, max_cached=2)
    a = StructuredSpec(StructuredKind.REGEX, "a+")
    assert comp.lookup(a) is None and comp.lookup(a) is None  # queued once, not twice
    assert events.get(timeout=120) == GrammarCompiled((int(StructuredKind.REGEX), "a+"))
    first = comp.lookup(a)
    assert isinstance(first, xgr.CompiledGrammar) and comp.lookup(a) is first
    bad = StructuredSpec(StructuredKind.REGEX, "(")
    assert comp.lookup(bad) is None
    events.get(timeout=60)
    assert isinstance(comp.lookup(bad), GrammarError)  # a failure is cached too
    assert events.empty()
    for value in ("b+", "c+"):  # two more evict the least recently used, `a`
        comp.lookup(StructuredSpec(StructuredKind.REGEX, value))
        events.get(timeout=60)
    assert comp.lookup(a) is None
    events.get(timeout=60)
    big = GrammarCompiler(model_dir, vocab_size=VOCAB, stop_token_ids=[EOS_ID], notify=events.put,
                          max_cached_chars=10)
    for value in ("x{1,100}", "y{1,100}"):  # 8 characters each: the second evicts the first
        big.lookup(StructuredSpec(StructuredKind.REGEX, value))
        events.get(timeout=120)
    assert big.lookup(StructuredSpec(StructuredKind.REGEX, "y{1,100}")) is not None
    assert big.lookup(StructuredSpec(StructuredKind.REGEX, "x{1,100}")) is None


def test_bitmask_is_as_wide_as_the_logits_not_the_tokenizer(model_dir):
    """A model whose lm_head is padded past the tokenizer: the padding is never allowed."""
    padded = VOCAB + 64
    events: queue.SimpleQueue = queue.SimpleQueue()
    comp = GrammarCompiler(model_dir, vocab_size=padded, stop_token_ids=[EOS_ID], notify=events.put)
    comp.lookup(StructuredSpec(StructuredKind.JSON_OBJECT, ""))
    events.get(timeout=120)
    grammar = RequestGrammar(comp.lookup(StructuredSpec(StructuredKind.JSON_OBJECT, "")))
    logits = torch.zeros(1, padded)
    out = GrammarMasker(torch.device("cpu")).masked(logits, [seq_with(grammar)], [0])
    assert torch.isinf(out[0, VOCAB:]).all() and torch.isfinite(out[0]).sum() > 0


# ---- bitmasks ----------------------------------------------------------------------------


@pytest.mark.parametrize("vocab_size", [64, 300, 49152])
def test_torch_twin_matches_xgrammars_kernel(vocab_size):
    gen = torch.Generator().manual_seed(vocab_size)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, (vocab_size + 31) // 32), dtype=torch.int32, generator=gen)
    bitmask[0] = -1  # a row that allows everything
    logits = torch.randn(5, vocab_size, generator=gen)
    twin, kernel = logits.clone(), logits.clone()
    apply_token_bitmask(twin, bitmask)
    apply_token_bitmask_kernel(kernel, bitmask)
    assert torch.equal(twin, kernel)
    assert torch.equal(twin[0], logits[0])
    token = 37  # bit 5 of word 1
    assert (twin[1:, token] == float("-inf")).tolist() == [not (int(w) >> 5) & 1 for w in bitmask[1:, 1]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_on_the_gpu_matches_the_twin():
    gen = torch.Generator().manual_seed(1)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (7, 1537), dtype=torch.int32, generator=gen).cuda()
    logits = torch.randn(7, 49180, generator=gen).cuda()
    twin, kernel = logits.clone(), logits.clone()
    apply_token_bitmask(twin, bitmask)
    apply_token_bitmask_kernel(kernel, bitmask)
    assert torch.equal(twin, kernel)


# ---- the sampler ---------------------------------------------------------------------------


def seq_with(grammar, output_ids=(), **params) -> ScheduledSeq:
    params.setdefault("max_tokens", 100)
    req = EngineRequest("r", "w", [5, 6, 7], SamplingParams(**params), output_ids=list(output_ids))
    req.grammar = grammar
    req.num_computed_tokens = req.num_tokens - 1
    return ScheduledSeq(req, req.num_tokens - 1, 1)


@pytest.mark.parametrize("use_kernel", [True, False])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_mask_forces_the_choice(compiler, tokenizer_ids, use_kernel, temperature):
    """Logits that want anything but the grammar's tokens still give `yes` or `no`, then eos, then STOP."""
    sampler = Sampler([EOS_ID], seed=0)
    sampler._grammar_masker = GrammarMasker(torch.device("cpu"), use_kernel=use_kernel)
    allowed = {tokenizer_ids("yes")[0], tokenizer_ids("no")[0]}
    free = seq_with(None, temperature=temperature, seed=1)  # an unconstrained row beside it
    forced = seq_with(RequestGrammar(compiled(compiler, CHOICE)), temperature=temperature, seed=1, logprobs=1,
                      min_tokens=50, ignore_eos=True)  # neither may keep a complete grammar going
    logits = torch.full((2, VOCAB), -30.0)
    logits[:, 1000] = 50.0  # what the "model" wants
    for token in allowed:
        logits[:, token] = -5.0
    out = sampler.sample(logits.clone(), [free, forced])
    assert out[0] == 1000 and out[1] in allowed
    # Logprobs stay the model's own distribution: the chosen token's is far below the top one's.
    lp = out.logprobs[1]
    assert lp.token_ids[0, 1] == 1000 and lp.logprobs[0, 0] < -50 and lp.ranks[0] > 1
    assert forced.req.grammar.finish is None
    forced.req.output_ids.append(out[1])
    out = sampler.sample(logits.clone(), [free, forced])
    assert out[1] == EOS_ID  # the grammar is complete: eos despite min_tokens and ignore_eos
    assert forced.req.grammar.finish is FinishReason.STOP


def test_a_dead_end_ends_the_request_as_a_stop(compiler, tokenizer_ids):
    """A rule that admits nothing behind a first token: after `a` the grammar allows no token at all. The client's
    grammar, not a failure of the engine's: the choice ends there as a stop (not an error, which is a 500)."""
    spec = StructuredSpec(StructuredKind.GRAMMAR, 'root ::= "a" never | "b"\nnever ::= never "c"')
    grammar = RequestGrammar(compiled(compiler, spec))
    for token_id in tokenizer_ids("a"):
        grammar.accept(token_id)
    assert grammar.finish is None
    logits = GrammarMasker(torch.device("cpu")).masked(torch.zeros(1, VOCAB), [seq_with(grammar)], [0])
    assert torch.isinf(logits).all() and grammar.finish is FinishReason.STOP


def test_a_grammar_with_start_ids_holds_only_after_them(compiler, tokenizer_ids):
    """StructuredSpec.start_ids (harmony's final channel): the output is free, the matcher untouched, until the
    output has written the start; from the next token the grammar holds."""
    start = tokenizer_ids("<|im_start|>final")
    grammar = RequestGrammar(compiled(compiler, CHOICE), start)
    masker = GrammarMasker(torch.device("cpu"))
    free = [*tokenizer_ids("no thinking here, "), start[0], *tokenizer_ids(" x "), *start]
    for token_id in free:
        assert torch.isfinite(masker.masked(torch.zeros(1, VOCAB), [seq_with(grammar)], [0])).all()  # all allowed
        grammar.accept(token_id)
    allowed = torch.isfinite(masker.masked(torch.zeros(1, VOCAB), [seq_with(grammar)], [0])[0])
    assert 0 < allowed.sum() < 10 and allowed[tokenizer_ids("yes")[0]]
    for token_id in tokenizer_ids("yes"):
        grammar.accept(token_id)
    grammar.accept(EOS_ID)
    assert grammar.finish is FinishReason.STOP


def test_batches_without_grammars_skip_the_mask(monkeypatch):
    sampler = Sampler([EOS_ID], seed=0)
    monkeypatch.setattr(GrammarMasker, "masked", lambda *a: pytest.fail("masked a batch without grammars"))
    logits = torch.randn(3, 50)
    assert sampler.sample(logits, [seq_with(None, temperature=0.0) for _ in range(3)]) == logits.argmax(-1).tolist()


# ---- the gate and the busy loop --------------------------------------------------------------


class NoRunner:
    kv_cache = type("KVCache", (), {"num_bytes": 0})
    vocab_size, lora = VOCAB, None  # the Runner protocol's (engine_proc/model/runner_api.py)


def make_core(compiler) -> tuple[EngineCore, list]:
    scheduler = Scheduler(BlockManager(64, 4, enable_prefix_caching=False), max_num_seqs=4,
                          max_num_batched_tokens=64, max_model_len=64, eos_token_ids=[EOS_ID])
    published: list = []
    return EngineCore(scheduler, NoRunner(), compiler.events, published.append,
                      grammar_gate=GrammarGate(compiler)), published


def structured_req(req_id: str, spec: StructuredSpec | None) -> EngineRequest:
    return EngineRequest(req_id, "w", [1, 2, 3], SamplingParams(max_tokens=4, structured=spec))


def test_requests_wait_for_their_grammar_without_holding_up_others(model_dir):
    events: queue.SimpleQueue = queue.SimpleQueue()
    comp = GrammarCompiler(model_dir, vocab_size=VOCAB, stop_token_ids=[EOS_ID], notify=events.put)
    comp.events = events
    core, published = make_core(comp)
    spec = StructuredSpec(StructuredKind.REGEX, "[0-9]+")
    core.handle(structured_req("a", spec))
    core.handle(structured_req("b", None))
    core.handle(structured_req("c", spec))
    a = core.scheduler._waiting["a"]
    assert a.state is RequestState.WAITING_FOR_GRAMMAR
    assert [s.req.req_id for s in core.scheduler.schedule().seqs] == ["b"]  # not stuck behind "a"
    core.drain_inputs(block=True)  # sleeps until the compile thread reports
    assert a.state is RequestState.WAITING and isinstance(a.grammar, RequestGrammar)
    # ("b" again too: these tests never call update(), so its prefill is scheduled anew)
    assert [s.req.req_id for s in core.scheduler.schedule().seqs] == ["b", "a", "c"]
    core.handle(structured_req("d", spec))  # compiled already: no waiting
    assert core.scheduler._waiting["d"].grammar is not None
    assert published == []


def test_a_grammar_that_fails_in_the_engine_ends_its_requests_only(compiler):
    core, published = make_core(compiler)
    bad = StructuredSpec(StructuredKind.GRAMMAR, "root ::= nowhere")  # the API would refuse it; say it got through
    core.handle(structured_req("x", bad))
    core.handle(structured_req("aborted", bad))
    core.handle(structured_req("fine", None))
    core.scheduler.abort("aborted")
    while not published:
        core.drain_inputs(block=True)
    [[(worker, delta, ids)]] = published
    assert (delta.req_id, delta.finish, ids) == ("x", FinishReason.ERROR, [])
    assert core.scheduler.live_req_ids() == ["fine"]
    core.handle(structured_req("again", bad))  # the failure is cached: ended at once
    assert published[-1][0][1].req_id == "again" and published[-1][0][1].finish is FinishReason.ERROR
    assert core.running
