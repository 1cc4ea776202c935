"""Whether a structured-output spec's grammar takes a text as a whole output: compiled against the byte
vocabulary the API's check uses (ipc/grammar_spec.py), no tokenizer needed."""
from __future__ import annotations

import xgrammar as xgr

from rill.ipc.grammar_spec import _NUM_BYTE_TOKENS, _byte_compiler, to_grammar
from rill.ipc.protocol import StructuredSpec


def admits(spec: StructuredSpec, text: str) -> bool:
    """Whether the grammar takes `text` as a whole output (then the stop token)."""
    matcher = xgr.GrammarMatcher(_byte_compiler().compile_grammar(to_grammar(spec)))
    return matcher.accept_string(text) and matcher.accept_token(_NUM_BYTE_TOKENS - 1)
