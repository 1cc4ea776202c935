"""What a StructuredSpec means: the xgrammar Grammar of each kind, shared by the API check and the engine.

xgrammar is imported on first use: it imports torch and transformers (about 2 s), which an API
worker pays only once it serves a structured request.
"""
from __future__ import annotations

import functools
import json
import re

from rill.ipc.protocol import StructuredKind, StructuredSpec

# OpenAI's json_object promises an object; xgrammar's builtin JSON grammar also admits arrays.
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# xgrammar's errors start with its C++ log prefix: "[05:35:31] /project/cpp/x.cc:83: ".
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")
_MAX_ERROR_LEN = 500  # some messages quote the whole schema


class GrammarError(ValueError):
    """xgrammar could not build the grammar of a spec; the message says why, for the client."""


def spec_key(spec: StructuredSpec) -> tuple[int, str]:
    """A hashable key of a spec (the msgspec struct itself is not hashable): (kind, value)."""
    return int(spec.kind), spec.value


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF grammar whose only sentences are `choices`; JSON escapes are EBNF escapes too."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def to_grammar(spec: StructuredSpec):
    """The xgrammar.Grammar of `spec` (no tokenizer needed); GrammarError if it is not valid."""
    import xgrammar as xgr

    kind, value = spec.kind, spec.value
    try:
        if kind is StructuredKind.JSON_SCHEMA:
            # strict_mode: no property or item the schema does not name (vLLM's default too).
            return xgr.Grammar.from_json_schema(value, any_whitespace=True, strict_mode=True)
        if kind is StructuredKind.JSON_OBJECT:
            return xgr.Grammar.from_json_schema(JSON_OBJECT_SCHEMA, any_whitespace=True)
        if kind is StructuredKind.REGEX:
            return xgr.Grammar.from_regex(value)
        if kind is StructuredKind.CHOICE:
            return xgr.Grammar.from_ebnf(choice_ebnf(json.loads(value)))
        if kind is StructuredKind.GRAMMAR:
            return xgr.Grammar.from_ebnf(value)
        if kind is StructuredKind.STRUCTURAL_TAG:
            return xgr.Grammar.from_structural_tag(value)
    except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar raises RuntimeError for every parse error
        raise GrammarError(error_text(exc)) from None
    raise GrammarError(f"unknown structured output kind {kind!r}")


def check_spec(spec: StructuredSpec) -> None:
    """GrammarError unless the spec builds a grammar that admits some output (the API's check).

    A grammar can parse and still admit nothing (`root ::= root "a"`, a regex of no character):
    in the engine its first bitmask would allow no token. Compiled here against a vocabulary of
    the 256 bytes and one stop token, which takes about a millisecond and needs no tokenizer.
    """
    import xgrammar as xgr

    grammar = to_grammar(spec)
    bitmask = xgr.allocate_token_bitmask(1, _NUM_BYTE_TOKENS)
    try:
        xgr.GrammarMatcher(_byte_compiler().compile_grammar(grammar)).fill_next_token_bitmask(bitmask, 0)
    except RuntimeError as exc:
        raise GrammarError(error_text(exc)) from None
    if not bitmask.any():
        raise GrammarError("it admits no output at all")


_NUM_BYTE_TOKENS = 257  # bytes 0..255, then the stop token


@functools.cache
def _byte_compiler():
    import xgrammar as xgr

    vocab = [bytes([b]) for b in range(256)] + [b"</s>"]
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, stop_token_ids=[_NUM_BYTE_TOKENS - 1])
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


def error_text(exc: BaseException) -> str:
    """xgrammar's message without its log prefix and trailing blank lines."""
    text = _LOG_PREFIX.sub("", str(exc).strip())
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= _MAX_ERROR_LEN else line[: _MAX_ERROR_LEN - 3] + "..."
