"""`strict` functions on GPT-OSS's harmony: the grammar of the whole output, every message one of harmony's, a call's
arguments held to its schema; its markers the model's own tokens where the tokenizer has them, compiled and matched
by the engine's own grammar classes."""
from __future__ import annotations

import threading

import pytest
from tokenizers import AddedToken, Tokenizer

from rill.asgi.parsers.tools.harmony import HarmonyParser
from rill.asgi.requests.harmony_calls import MARKERS
from rill.asgi.requests.strict_calls import strict_calls
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan
from rill.engine_proc.grammar.compiler import GrammarCompiler
from rill.engine_proc.grammar.matcher import RequestGrammar
from rill.ipc.protocol import FinishReason
from tests.helpers.grammar_checks import admits
from tests.helpers.parser_checks import check_every_split

CITY = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
    "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
THINK = "<|channel|>analysis<|message|>The user wants the weather.<|end|><|start|>assistant"


def plan(max_calls=None) -> ToolPlan:
    return ToolPlan(ToolMode.AUTO, [CITY, TIME], max_calls=max_calls, strict=("get_weather",))


def call(name: str, arguments: str, header: str = "<|channel|>commentary to=functions.{} <|constrain|>json") -> str:
    return header.format(name) + "<|message|>" + arguments + "<|call|>"


def test_every_message_is_harmony_and_a_strict_call_follows_its_schema():
    spec = strict_calls(plan(), "openai")
    good = THINK + call("get_weather", '{"city": "Paris"}')
    assert admits(spec, good)
    assert admits(spec, THINK + "<|channel|>final<|message|>Sunny.<|return|>")
    assert admits(spec, "<|channel|>commentary<|message|>Let me see.<|end|><|start|>assistant" + call("get_time", "{}"))
    # The header as the template writes a past call back, after the start the prompt may leave out.
    assert admits(spec, "<|start|>assistant" + call("get_weather", '{"city": "Rome"}', " to=functions.{}"
                                                                                      "<|channel|>commentary json"))
    assert admits(spec, call("get_weather", '{"city": "Rome"}', "<|channel|>commentary to=functions.{}"))
    assert not admits(spec, THINK + call("get_weather", '{"city": "Berlin"}'))  # not in the enum
    assert not admits(spec, THINK + call("get_weather", '{"town": "Paris"}'))
    assert not admits(spec, THINK + call("get_news", "{}"))  # not a tool
    assert not admits(spec, "It is sunny.")  # not harmony
    assert not admits(spec, THINK + call("get_time", "[1]"))  # not strict: still an object
    assert admits(spec, THINK + call("get_time", '{"anything": [1]}'))
    message = check_every_split(HarmonyParser, good)
    [parsed] = message["tool_calls"]
    assert parsed["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert message["reasoning_content"] == "The user wants the weather."


def test_parallel_tool_calls_false_ends_at_the_first_call():
    two = THINK + call("get_weather", '{"city": "Paris"}') + "<|start|>assistant" + call("get_time", "{}")
    assert admits(strict_calls(plan(), "openai"), two)
    assert not admits(strict_calls(plan(max_calls=1), "openai"), two)
    assert admits(strict_calls(plan(max_calls=1), "openai"), THINK + call("get_time", "{}"))


def test_the_recipient_first_at_the_output_s_start_is_a_call():
    message = check_every_split(HarmonyParser, ' to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>')
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_time"] and message["content"] is None


@pytest.fixture(scope="module")
def gpt_oss_tokens(model_dir, tmp_path_factory):
    """The bundled tokenizer with harmony's markers added as special tokens, as GPT-OSS's has them: (its
    directory, the tokenizer)."""
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(m, special=True) for m in MARKERS])
    path = tmp_path_factory.mktemp("gpt-oss-tokens")
    tokenizer.save(str(path / "tokenizer.json"))
    return path, tokenizer


def test_the_markers_are_the_model_s_tokens_in_the_engine(gpt_oss_tokens):
    """With the markers one token each, the grammar holds those tokens: a marker spelled in pieces is refused, in a
    header and in free text alike; the engine's compiler and matcher run it, and `<|call|>` (a stop token of
    GPT-OSS) ends the request."""
    path, tokenizer = gpt_oss_tokens
    ids = {m: tokenizer.token_to_id(m) for m in MARKERS}
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False).ids  # noqa: E731
    spec = strict_calls(plan(), "openai", encode)
    assert all(f'"token": {i}' in spec.value for i in ids.values())
    done = threading.Event()
    compiler = GrammarCompiler(path, vocab_size=tokenizer.get_vocab_size(),
                               stop_token_ids=[ids["<|call|>"], ids["<|return|>"]], notify=lambda _: done.set())
    assert compiler.lookup(spec) is None and done.wait(60)
    compiled = compiler.lookup(spec)

    def run(pieces: list[str]) -> RequestGrammar:
        grammar = RequestGrammar(compiled)
        for piece in pieces:
            for token in [ids[piece]] if piece in ids else encode(piece):
                assert grammar.finish is None
                grammar.accept(token)
        return grammar

    marked = ["<|channel|>", "analysis", "<|message|>", "Weather.", "<|end|>", "<|start|>", "assistant", "<|channel|>",
              "commentary to=functions.get_weather", " ", "<|constrain|>", "json", "<|message|>", '{"city": "Rome"}',
              "<|call|>"]
    assert run(marked).finish is FinishReason.STOP
    spelled = run(["<|channel|>", "analysis", "<|message|>", "Weather.", "<|end|>", "<|start|>", "assistant"])
    for token in encode("<|") + encode("channel|>"):  # the tokenizer's own splits of the text, not the marker
        spelled.accept(token)
    assert spelled.finish is FinishReason.ERROR
    in_text = run(["<|channel|>", "analysis", "<|message|>", "Weather."])
    in_text.accept(ids["<|call|>"])  # free text holds no marker
    assert in_text.finish is FinishReason.ERROR
    # What the thinking budget writes to end an analysis (HARMONY.close) is the grammar's too.
    budget = run(["<|channel|>", "analysis", "<|message|>", "Weather."])
    for token in encode("<|end|><|start|>assistant<|channel|>final<|message|>") + encode("Sunny."):
        budget.accept(token)
    budget.accept(ids["<|return|>"])
    assert budget.finish is FinishReason.STOP
