"""`rill serve` flags of chat templates, tool calls and reasoning, checked before anything starts (and
the sampling defaults' flags, --generation-config and --override-generation-config)."""
from __future__ import annotations

import argparse

from rill.asgi.parsers.reasoning import REASONING_PARSERS
from rill.asgi.parsers.tools import TOOL_PARSERS

DEFAULT_IMAGES, MAX_IMAGES = 8, 64  # images per chat request; each is a vision-tower forward in the engine


def add_chat_flags(ap: argparse.ArgumentParser) -> None:
    """README: "Chat templates", "Tool calls", "Reasoning"."""
    chat = ap.add_argument_group("chat templates, tool calls, reasoning")
    chat.add_argument("--trust-request-chat-template", action="store_true",
                      help="let a request bring its own `chat_template` (rendered in the jinja2 sandbox); "
                           "without it such a request gets 400")
    chat.add_argument("--default-chat-template-kwargs", default=None,
                      help='keyword arguments every chat template render gets, as JSON (a request\'s own '
                           'chat_template_kwargs win): {"enable_thinking": false} turns Qwen3\'s thinking off')
    chat.add_argument("--tool-call-parser", choices=["auto", *sorted(TOOL_PARSERS)], default=None,
                      help="how the model writes tool calls (vLLM's names; docs/tool-calls.md): auto picks one from "
                           "the chat template")
    chat.add_argument("--enable-auto-tool-choice", action="store_true",
                      help='let the model choose to call tools (tool_choice "auto", the default when a request '
                           "has tools); needs --tool-call-parser")
    chat.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                      help="split the thinking into reasoning_content (vLLM's names): deepseek_r1 "
                           "(the opening <think> may be absent), qwen3, openai_gptoss (GPT-OSS's analysis channel)")
    chat.add_argument("--mm-processor-kwargs", default=None,
                      help='a Qwen2-VL or Qwen2.5-VL image processor\'s pixel budget, as vLLM\'s JSON: '
                           '{"max_pixels": 1003520, "min_pixels": 3136} (default max 1003520: 1,280 tokens an image; '
                           'docs/vision.md)')
    chat.add_argument("--limit-mm-per-prompt", default=None,
                      help=f'a vision model\'s images per chat request, as vLLM\'s JSON: {{"image": 4}} (default '
                           f'{DEFAULT_IMAGES}, at most {MAX_IMAGES}; docs/vision.md)')


def check_chat_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Exits (status 2) with one line naming the flag for a chat template that does not load or
    compile, or --enable-auto-tool-choice without a parser: at start, not on the first request."""
    from rill.asgi.prompt.templating import TemplateError, load_template_arg

    if args.enable_auto_tool_choice and not args.tool_call_parser:
        _fail(parser, "--enable-auto-tool-choice needs --tool-call-parser")
    _check_generation_config(args, parser)
    try:
        default_template_kwargs(args.default_chat_template_kwargs)
    except ValueError as exc:
        _fail(parser, f"--default-chat-template-kwargs: {exc}")
    try:
        images_per_prompt(args.limit_mm_per_prompt)
    except ValueError as exc:
        _fail(parser, f"--limit-mm-per-prompt: {exc}")
    try:
        processor_kwargs(args.mm_processor_kwargs)
    except ValueError as exc:
        _fail(parser, f"--mm-processor-kwargs: {exc}")
    if args.chat_template is not None:
        model_dir = args.model  # the bundled model's tokens are not needed to check the template compiles
        try:
            load_template_arg(args.chat_template, model_dir)
        except TemplateError as exc:
            _fail(parser, f"--chat-template: {exc}")


def default_template_kwargs(text: str | None) -> dict:
    """--default-chat-template-kwargs' JSON object: at most MAX_TEMPLATE_KWARGS entries, none of the
    names a request's own fields set."""
    from rill.asgi.prompt.templating import RESERVED_KWARGS
    from rill.asgi.requests.bounds import MAX_TEMPLATE_KWARGS
    from rill.ipc.config import json_object

    if not text:
        return {}
    kwargs = json_object(text, not_json="not JSON: ", not_object='a JSON object, such as {"enable_thinking": false}')
    if reserved := RESERVED_KWARGS & kwargs.keys():
        raise ValueError(f"must not set {sorted(reserved)}: the request's own fields do")
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise ValueError(f"at most {MAX_TEMPLATE_KWARGS} entries")
    return kwargs


def _check_generation_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    from pathlib import Path

    from rill.asgi.requests.sampling_defaults import IGNORE, DefaultsError, parse_override

    source = args.generation_config
    if source not in ("auto", *IGNORE) and not (Path(source) / "generation_config.json").is_file():
        _fail(parser, f"--generation-config: {source!r} is not auto, vllm, none or a folder with a "
                      "generation_config.json")
    try:
        parse_override(args.override_generation_config)
    except DefaultsError as exc:
        _fail(parser, f"--override-generation-config: {exc}")


def _fail(parser: argparse.ArgumentParser, message: str) -> None:
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def log_tool_parser(args: argparse.Namespace, model_dir) -> None:
    """With --tool-call-parser auto, which parser the served chat template picks (a request's own template
    picks for itself)."""
    import logging

    from rill.asgi.parsers.tools.auto import pick_tool_parser
    from rill.asgi.prompt.templating import ChatTemplate, load_template_arg

    if args.tool_call_parser != "auto":
        return
    template = load_template_arg(args.chat_template, model_dir) if args.chat_template else ChatTemplate(model_dir)
    log = logging.getLogger("rill")
    if name := pick_tool_parser(template.source):
        log.info("--tool-call-parser auto: %s, from the chat template (%s)", name, template.origin)
    else:
        log.warning("--tool-call-parser auto: the chat template (%s) shows no tool-call format Rill reads; "
                    '"auto" tool choice gets 400 unless a request brings its own chat_template', template.origin)


def images_per_prompt(text: str | None) -> int:
    """--limit-mm-per-prompt's image count (vLLM's JSON object of counts by modality; only images are served)."""
    from rill.ipc.config import json_object

    if not text:
        return DEFAULT_IMAGES
    limits = json_object(text, not_json="not JSON: ", not_object='a JSON object, such as {"image": 4}')
    for modality, count in limits.items():
        if modality != "image" and count != 0:
            raise ValueError(f"{modality!r}: only images are served; leave it out or give it 0")
    count = limits.get("image", DEFAULT_IMAGES)
    if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_IMAGES:
        raise ValueError(f'"image" must be a whole number from 0 to {MAX_IMAGES}, not {count!r}')
    return count


def processor_kwargs(text: str | None) -> dict[str, int]:
    """--mm-processor-kwargs (vLLM's JSON for the model's processor): of it, Qwen2-VL's and Qwen2.5-VL's pixel
    budget, min_pixels and max_pixels (ipc/images.py), whole numbers within the models' own bounds."""
    from rill.ipc.config import json_object
    from rill.ipc.images import DEFAULT_MAX_PIXELS, MAX_PIXELS, MIN_PIXELS

    if not text:
        return {}
    kwargs = json_object(text, not_json="not JSON: ", not_object='a JSON object, such as {"max_pixels": 1003520}')
    for name, value in kwargs.items():
        if name not in ("min_pixels", "max_pixels"):
            raise ValueError(f"{name!r}: only min_pixels and max_pixels (Qwen2-VL's and Qwen2.5-VL's) are served")
        if not isinstance(value, int) or isinstance(value, bool) or not MIN_PIXELS <= value <= MAX_PIXELS:
            raise ValueError(f"{name} must be a whole number of pixels from {MIN_PIXELS} to {MAX_PIXELS}, not {value!r}")
    if kwargs.get("min_pixels", MIN_PIXELS) > kwargs.get("max_pixels", DEFAULT_MAX_PIXELS):
        raise ValueError(f"min_pixels is more than max_pixels ({kwargs.get('max_pixels', DEFAULT_MAX_PIXELS)}"
                         f"{'' if 'max_pixels' in kwargs else ', the default'})")
    return kwargs
