"""Chat templates: load a model's jinja2 template (or a bundled one) and render messages."""

from __future__ import annotations

import importlib.resources
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

# The top-level templates/ folder, installed as the package rill_templates (pyproject.toml).
BUNDLED_TEMPLATES_DIR = Path(str(importlib.resources.files("rill.templates")))
DEFAULT_TEMPLATE_NAME = "chatml"


class TemplateError(ValueError):
    """A chat template failed to compile or to render; the API turns it into a 400."""


# Set by a request's own fields, never through chat_template_kwargs (nor --default-chat-template-kwargs).
RESERVED_KWARGS = frozenset({"messages", "add_generation_prompt", "continue_final_message", "tools", "chat_template",
                             "documents"})


def _raise_exception(message: str) -> None:
    # Templates call raise_exception("Conversation roles must alternate ...") on bad input:
    # that is the request's fault, so it surfaces with the template's own words.
    raise TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters and non-ASCII; HF overrides it like this,
    # and templates written for HF expect tool schemas rendered this way.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent,
                      separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationTag(jinja2.ext.Extension):
    """Accept HF's `{% generation %}...{% endgeneration %}` and render its body unchanged.

    HF uses the tag to find assistant tokens for training masks; for serving it is a no-op,
    but without this extension such templates would not even compile.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: jinja2.runtime.Macro) -> str:
        return caller()


def _make_environment() -> ImmutableSandboxedEnvironment:
    # The same environment HF's apply_chat_template uses, so Hub templates render alike.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_text(value: Any) -> str:
    """tokenizer_config.json stores special tokens as strings or as AddedToken dicts."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _pick_named(templates: list[dict[str, Any]]) -> str | None:
    """From HF's list form [{name, template}], the one named "default" (else the first)."""
    by_name = {t.get("name"): t.get("template") for t in templates if isinstance(t, dict)}
    chosen = by_name.get("default", next(iter(by_name.values()), None))
    return chosen if isinstance(chosen, str) else None


def _special_tokens(model_dir: Path) -> tuple[str, str]:
    config = _read_json(model_dir / "tokenizer_config.json")
    # Older checkpoints keep the special tokens only in special_tokens_map.json.
    special = _read_json(model_dir / "special_tokens_map.json")
    bos = _token_text(config.get("bos_token")) or _token_text(special.get("bos_token"))
    eos = _token_text(config.get("eos_token")) or _token_text(special.get("eos_token"))
    return bos, eos


def _model_template(model_dir: Path) -> tuple[str, str] | None:
    """(source, origin) of the template a model dir ships, or None."""
    config_path = model_dir / "tokenizer_config.json"
    template = _read_json(config_path).get("chat_template")
    if isinstance(template, list):
        template = _pick_named(template)
    if isinstance(template, str) and template:
        return template, str(config_path)
    jinja_path = model_dir / "chat_template.jinja"  # where transformers >= 4.50 saves it
    if jinja_path.is_file():
        return jinja_path.read_text(encoding="utf-8"), str(jinja_path)
    # Multimodal processors save {"chat_template": "..."} here.
    json_path = model_dir / "chat_template.json"
    template = _read_json(json_path).get("chat_template")
    if isinstance(template, str) and template:
        return template, str(json_path)
    return None


class ChatTemplate:
    """One compiled chat template; build it once per process and render per request.

    ChatTemplate(model_dir) takes the model's template from tokenizer_config.json
    ("chat_template": a string, or a list of {name, template} whose "default" is used), else
    chat_template.jinja, else chat_template.json, else the bundled templates/chatml.jinja.

    Tokenize what render() returns with add_special_tokens=(not renders_bos_token): a
    template that writes bos_token itself (Llama 3, Mistral, SmolLM's ChatML whose "BOS" is
    <|im_start|>) must not get a second BOS from the tokenizer's post-processor.
    """

    def __init__(self, model_dir: str | Path) -> None:
        """The template a model dir ships, else the bundled ChatML one."""
        model_dir = Path(model_dir)
        bos, eos = _special_tokens(model_dir)
        source, origin = _model_template(model_dir) or _bundled_source(DEFAULT_TEMPLATE_NAME)
        self._compile(source, bos_token=bos, eos_token=eos, origin=origin)

    @classmethod
    def from_string(cls, source: str, *, bos_token: str = "", eos_token: str = "",
                    origin: str = "<string>") -> ChatTemplate:
        template = cls.__new__(cls)
        template._compile(source, bos_token=bos_token, eos_token=eos_token, origin=origin)
        return template

    @classmethod
    def from_file(cls, path: str | Path, *, model_dir: str | Path | None = None) -> ChatTemplate:
        """A template file given on the command line (--chat-template); pass model_dir so
        that bos_token and eos_token come from the served model (else they are "")."""
        path = Path(path)
        bos, eos = _special_tokens(Path(model_dir)) if model_dir is not None else ("", "")
        return cls.from_string(path.read_text(encoding="utf-8"), bos_token=bos, eos_token=eos,
                               origin=str(path))

    @classmethod
    def bundled(cls, name: str, *, model_dir: str | Path | None = None) -> ChatTemplate:
        """One of templates/*.jinja by name: "chatml", "llama3" or "plain"."""
        source, origin = _bundled_source(name)
        bos, eos = _special_tokens(Path(model_dir)) if model_dir is not None else ("", "")
        return cls.from_string(source, bos_token=bos, eos_token=eos, origin=origin)

    def _compile(self, source: str, *, bos_token: str, eos_token: str, origin: str) -> None:
        self.source = source
        self.origin = origin
        self.bos_token = bos_token
        self.eos_token = eos_token
        try:
            self._template = _make_environment().from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise TemplateError(f"chat template {origin}, line {e.lineno}: {e.message}") from e
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template {origin}: {e.message}") from e
        self.renders_bos_token = self._probe_renders_bos()

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               continue_final_message: bool = False, **kwargs: Any) -> str:
        """The prompt text for messages; extra kwargs (chat_template_kwargs) reach the template.

        continue_final_message: the prompt ends with the final message's text, without the
        end-of-turn the template writes after it, so the model continues that message.
        """
        text = self._render(messages, add_generation_prompt, kwargs)
        return _cut_after_final_message(text, messages) if continue_final_message else text

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool, kwargs: dict[str, Any]) -> str:
        # HF passes tools/documents as None when absent; some templates test `is not none`.
        context = {"tools": None, "documents": None,
                   "bos_token": self.bos_token, "eos_token": self.eos_token, **kwargs,
                   "messages": messages, "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(context)
        except TemplateError:
            raise
        except jinja2.TemplateError as e:
            raise TemplateError(f"chat template error: {e.message or type(e).__name__}") from e
        except Exception as e:
            # A template doing `'<|im_start|>' + message['content']` on a null content raises
            # TypeError: still the request's fault, so a 400 and never a 500.
            raise TemplateError(f"chat template error: {type(e).__name__}: {e}") from e

    def _probe_renders_bos(self) -> bool:
        if not self.bos_token:
            return False
        try:
            prompt = self.render([{"role": "user", "content": "hi"}])
        except TemplateError:
            # Some templates insist on a system message or other shapes: judge by the source.
            return "bos_token" in self.source
        return prompt.startswith(self.bos_token)


def _cut_after_final_message(text: str, messages: list[dict[str, Any]]) -> str:
    """HF's continue_final_message: cut the rendered text after the final message's text (the
    template may have stripped its surrounding whitespace)."""
    final = messages[-1].get("content") if messages else None
    if not isinstance(final, str) or not final.strip():
        raise TemplateError("continue_final_message needs a final message with text to continue")
    at = text.rfind(final.strip())
    if at < 0:
        raise TemplateError("continue_final_message: the final message's text does not appear in the "
                            "rendered chat; this template changes it")
    if text[at:at + len(final.lstrip())] == final.lstrip():
        return text[:at + len(final.lstrip())]
    return text[:at + len(final.strip())]


_REQUEST_TEMPLATES: dict[tuple[str, str, str], ChatTemplate] = {}
_NUM_REQUEST_TEMPLATES = 16


def request_template(source: str, served: ChatTemplate) -> ChatTemplate:
    """A request's own `chat_template`, compiled once per worker (the last few kept), with the
    served model's special tokens; rendered in the same sandbox as every template."""
    key = (source, served.bos_token, served.eos_token)
    template = _REQUEST_TEMPLATES.get(key)
    if template is None:
        template = ChatTemplate.from_string(source, bos_token=served.bos_token, eos_token=served.eos_token,
                                            origin="the request's chat_template")
        if len(_REQUEST_TEMPLATES) >= _NUM_REQUEST_TEMPLATES:
            del _REQUEST_TEMPLATES[next(iter(_REQUEST_TEMPLATES))]
        _REQUEST_TEMPLATES[key] = template
    return template


def load_template_arg(arg: str, model_dir: str | Path | None = None) -> ChatTemplate:
    """`--chat-template ARG`, as vLLM reads it: a file, else a bundled template's name (chatml,
    llama3, plain), else (when it holds jinja's braces or a newline) the template itself.
    Raises TemplateError with the reason when none of these works or the template is broken."""
    path = Path(arg)
    if path.is_file():
        try:
            return ChatTemplate.from_file(path, model_dir=model_dir)
        except (OSError, UnicodeDecodeError) as e:
            raise TemplateError(f"chat template file {arg}: {e}") from e
    if (BUNDLED_TEMPLATES_DIR / f"{arg}.jinja").is_file():
        return ChatTemplate.bundled(arg, model_dir=model_dir)
    if not any(c in arg for c in "{}\n"):
        known = ", ".join(sorted(p.stem for p in BUNDLED_TEMPLATES_DIR.glob("*.jinja")))
        raise TemplateError(f"chat template {arg!r}: no such file (nor a bundled template: {known})")
    bos, eos = _special_tokens(Path(model_dir)) if model_dir is not None else ("", "")
    return ChatTemplate.from_string(arg, bos_token=bos, eos_token=eos, origin="--chat-template")


def _bundled_source(name: str) -> tuple[str, str]:
    path = BUNDLED_TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        known = sorted(p.stem for p in BUNDLED_TEMPLATES_DIR.glob("*.jinja"))
        raise TemplateError(f"no bundled chat template {name!r} (known: {', '.join(known)})")
    return path.read_text(encoding="utf-8"), str(path)
