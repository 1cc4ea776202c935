"""vLLM's `olmo3` tool parser: OLMo 3's calls, one a line, in tags,

    <function_calls>
    get_weather(city="Paris", metric=true)
    get_time()
    </function_calls>

read as `pythonic` reads a list of calls (pythonic.py: keyword arguments of literals, each call out whole once its
`)` arrives, text that turns out not to be calls is content), with JSON's `true`, `false` and `null` taken for
Python's. As `pythonic`, only an output that begins (after whitespace) with the tag is read as calls; the text after
`</function_calls>` is content.
"""
from __future__ import annotations

import ast

from rill.asgi.parsers.tools.pythonic import PythonicParser, call_arguments

START, END = "<function_calls>", "</function_calls>"
JSON_LITERALS = {"true": True, "false": False, "null": None}


class _JsonLiterals(ast.NodeTransformer):
    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in JSON_LITERALS:
            return ast.copy_location(ast.Constant(JSON_LITERALS[node.id]), node)
        return node


def olmo3_arguments(text: str) -> tuple[str, str] | None:
    """call_arguments, JSON's literals read as Python's (a name other than the call's is still not a literal)."""
    try:
        call = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return None
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
        return None
    call.keywords = [_JsonLiterals().visit(keyword) for keyword in call.keywords]
    return call_arguments(ast.unparse(call))


class Olmo3Parser(PythonicParser):
    arguments_of = staticmethod(olmo3_arguments)

    def _start(self, final: bool) -> bool:
        head = self.pending.lstrip()
        if head.startswith(START):
            self.pos, self.state = len(self.pending) - len(head) + len(START), "item"
        elif not final and START.startswith(head):
            return False
        else:
            self.state = "content"
        return True

    def _between(self, final: bool) -> bool:
        """Between calls (one a line): whitespace, then a call's name or the closing tag."""
        text, i = self.pending, self.pos
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        self.pos = i
        rest = text[i:]
        if rest.startswith(END) and self.num_calls:
            self.state, self.pos = "end", i + len(END)
        elif not rest or not final and END.startswith(rest):
            if final:
                self._not_calls(i)
            return False
        elif rest[0].isidentifier():
            self.state, self.call_start = "name", i
        else:
            self._not_calls(i)
        return True

    def _end(self, final: bool) -> bool:
        self.state, self.pending = "content", self.pending[self.pos:]
        return True
