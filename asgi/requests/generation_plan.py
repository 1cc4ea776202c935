"""One generation pipeline for the chat-shaped routes (chat completions, Responses, Messages): a chat request in,
what the engine and the output need out. Each route adapts its own body to a chat request first and shapes the
answer after; everything between is here, once.

The order: the tool-call parser (--tool-call-parser, or `auto`'s pick from the request's template) and the tool
plan; the prompt; the constraints compiled (a 400 if bad); the sampling parameters with the model's defaults;
the grammar (the request's constraint, else strict tools' calls, after the thinking where a reasoning parser
is on; or a forced call's from the first token); the thinking budget; the output parsers and the detokenizer.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rill.asgi.errors import APIError
from rill.asgi.parsers.chat_output import OutputParser
from rill.asgi.parsers.chat_parsing import keeps_special_tokens, parser_factory
from rill.asgi.parsers.reasoning import thinking_switched_off
from rill.asgi.parsers.thinking_markers import HARMONY_PARSER, thinking_markers
from rill.asgi.prompt.chat_messages import render_chat, template_source, tool_parser_name
from rill.asgi.prompt.truncation import truncate
from rill.asgi.requests.priority import request_priority
from rill.asgi.requests.sampling import sampling_params
from rill.asgi.requests.schemas import ChatCompletionRequest
from rill.asgi.requests.strict_calls import strict_calls
from rill.asgi.requests.structural_tags import after_reasoning
from rill.asgi.requests.structured import load_checker, text_format_spec
from rill.asgi.requests.thinking import honoured_effort, requested_tokens, thinking_budget
from rill.asgi.requests.tool_choice import ToolMode, ToolPlan, forced_spec, plan_tools
from rill.ipc.images import ImageInputs
from rill.ipc.protocol import SamplingParams

_FROM_REQUEST = object()  # the budget from the chat request's own fields


@dataclass
class GenerationPlan:
    prompt_ids: list[int]
    params: SamplingParams
    tool_plan: ToolPlan
    make_parser: Callable[[], OutputParser]  # one per choice
    make_detok: Callable[[], Any]
    effort: str | None = None  # the reasoning effort honoured (asgi/requests/thinking.py), as the answer says it


async def plan_generation(state, chat: ChatCompletionRequest, *, max_tokens: int | None,
                          prompt_ids: list[int] | None = None, prompt_param: str = "messages",
                          max_tokens_param: str = "max_tokens", text_format: dict[str, Any] | None = None,
                          text_format_param: str = "text.format",
                          thinking_tokens: int | None | object = _FROM_REQUEST, stop: list[str] | None = None,
                          skip_special_tokens: bool = True, include_stop: bool = False,
                          logprobs: int | None = None, prompt_logprobs: int | None = None,
                          lora: str = "", images: ImageInputs | None = None) -> GenerationPlan:
    """`prompt_ids`: already rendered (the Responses API renders first, to store its messages), with its `images`;
    `text_format`: the Responses API's `text.format` (or the Messages API's output format, named `text_format_param`
    in errors); `thinking_tokens`: a budget the route worked out
    itself (Anthropic's budget_tokens), else the chat request's own; `lora`: the LoRA adapter (resolve_model's);
    the rest as sampling_params and the detokenizer take them."""
    http = state.settings.http
    parser_name = tool_parser_name(state, chat)
    tool_plan = plan_tools(chat, parser_name=parser_name, auto_enabled=http.enable_auto_tool_choice)
    if prompt_ids is None:
        prompt_ids, images = await render_chat(state, chat)
    if images is not None and chat.truncate_prompt_tokens is not None:
        raise APIError(400, "`truncate_prompt_tokens` would cut an image's tokens: it is not served with images.",
                       param="truncate_prompt_tokens")
    [prompt_ids] = truncate([prompt_ids], chat.truncate_prompt_tokens, state.settings.limits.max_model_len)
    strict = strict_calls(tool_plan, parser_name)
    await load_checker(chat, forced_schema=tool_plan.schema, text_format=text_format, strict=strict,
                       text_format_param=text_format_param)
    params = sampling_params(chat, max_tokens=max_tokens, prompt_len=len(prompt_ids),
                             max_model_len=state.settings.limits.max_model_len, prompt_param=prompt_param,
                             vocab_size=state.settings.limits.vocab_size, logprobs=logprobs,
                             max_tokens_param=max_tokens_param, prompt_logprobs=prompt_logprobs,
                             defaults=state.sampling_defaults, tokenizer=state.tokenizer,
                             max_logprobs=http.max_logprobs, logprobs_param="top_logprobs")
    params.lora = lora
    params.images = images
    params.priority = request_priority(chat.priority, state.settings.limits)
    constraint = text_format_spec(text_format, text_format_param) if text_format else params.structured
    # Think, then constrain: the request's constraint (else strict tools' calls) from the end of the thinking on;
    # a forced call's (tool_choice required or named) from the first token.
    template_kwargs = {**http.default_chat_template_kwargs, **(chat.chat_template_kwargs or {})}
    reasoning_parser = None if thinking_switched_off(http.reasoning_parser, template_kwargs) else http.reasoning_parser
    markers = thinking_markers(reasoning_parser, harmony_calls=tool_plan.mode is ToolMode.AUTO and
                               parser_name == HARMONY_PARSER)
    encode = state.encode_markers
    if constraint is None and strict is not None and parser_name == HARMONY_PARSER:
        # Harmony's strict calls: the whole output's grammar, thinking included, its markers the model's tokens.
        params.structured = strict_calls(tool_plan, parser_name, encode)
    else:
        params.structured = forced_spec(tool_plan, after_reasoning(constraint or strict, markers, encode))
    if thinking_tokens is _FROM_REQUEST:
        params.thinking = thinking_budget(requested_tokens(chat), markers, encode, param=(
            "thinking_token_budget" if chat.thinking_token_budget is not None else None))
    else:
        params.thinking = thinking_budget(thinking_tokens, markers, encode)
    make_parser = parser_factory(tool_plan, tool_parser=parser_name, reasoning_parser=reasoning_parser)
    keeps = keeps_special_tokens(tool_plan, parser_name, reasoning_parser)
    make_detok = state.detokenizer(stop=stop or [], include_stop=include_stop,
                                   skip_special_tokens=skip_special_tokens and not keeps)
    effort = honoured_effort(chat.reasoning_effort, markers, template_source(state, chat))
    return GenerationPlan(prompt_ids, params, tool_plan, make_parser, make_detok, effort)
