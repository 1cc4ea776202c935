"""POST /v1/chat/completions: messages -> chat template -> engine -> chunks or one body."""
from __future__ import annotations

from rill.asgi.engine_link.generate import Generation, new_request_id
from rill.asgi.http.access_log import log_request_content
from rill.asgi.http.request_context import current
from rill.asgi.http.router import HTTPRequest
from rill.asgi.output.chat_format import ChatFormatter
from rill.asgi.output.logprobs_format import ChatLogprobs
from rill.asgi.output.respond import ChunkStream, respond
from rill.asgi.parsers.chat_parsing import keeps_special_tokens, parser_factory
from rill.asgi.prompt.chat_messages import render_messages, tool_parser_name
from rill.asgi.requests.nvext import NvExtReply
from rill.asgi.requests.sampling import sampling_params
from rill.asgi.requests.schemas import chat_decoder, stop_strings, stream_usage
from rill.asgi.requests.strict_calls import strict_calls
from rill.asgi.requests.structural_tags import after_reasoning
from rill.asgi.requests.structured import load_checker
from rill.asgi.requests.thinking import chat_thinking
from rill.asgi.requests.tool_choice import forced_spec, plan_tools
from rill.asgi.routes.lora_admin import decode_for_model
from rill.asgi.state import WorkerState


async def chat_completions(http: HTTPRequest) -> None:
    state: WorkerState = http.state
    req = await decode_for_model(state, chat_decoder, http.body)  # the served model or a LoRA adapter
    if (ctx := current()) is not None:
        ctx.model = req.model
    log_request_content(state.settings.http.log_requests, req)
    stop = stop_strings(req)
    settings = state.settings
    parser_name = tool_parser_name(state, req)
    tool_plan = plan_tools(req, parser_name=parser_name, auto_enabled=settings.http.enable_auto_tool_choice)
    prompt_ids = await render_messages(state, req)
    await load_checker(req, forced_schema=tool_plan.schema)
    limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    num_top = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(req, max_tokens=limit, prompt_len=len(prompt_ids),
                             max_model_len=state.settings.limits.max_model_len, prompt_param="messages",
                             vocab_size=state.settings.limits.vocab_size, logprobs=num_top,
                             prompt_logprobs=req.prompt_logprobs, defaults=state.sampling_defaults)
    # Think, then constrain: the request's constraint applies from the end of the thinking on; a forced call's
    # (tool_choice required or named) from the first token.
    structured = after_reasoning(params.structured or strict_calls(tool_plan, parser_name), settings.http.reasoning_parser)
    params.structured = forced_spec(tool_plan, structured)
    make_parser = parser_factory(tool_plan, tool_parser=parser_name,
                                 reasoning_parser=settings.http.reasoning_parser)
    params.lora = "" if req.model == state.model_id else req.model  # a LoRA adapter (--lora-modules)
    params.thinking = chat_thinking(state, req)  # thinking_token_budget, reasoning_effort
    request_id = new_request_id("chatcmpl")
    skip_special = req.skip_special_tokens and not keeps_special_tokens(tool_plan, parser_name)
    make_detok = state.detokenizer(stop=stop, skip_special_tokens=skip_special,
                                   include_stop=req.include_stop_str_in_output)
    n = req.n or 1
    gen = Generation(state.client, request_id, [prompt_ids], params, make_detok, n=n)
    include_usage, continuous_usage = stream_usage(req)
    fmt = ChatFormatter(request_id, req.model, n, include_usage, make_parser=make_parser,
                        logprobs=None if num_top is None else ChatLogprobs(state.token_texts, num_top),
                        prompt_scores=None if req.prompt_logprobs is None else (state.token_texts, req.prompt_logprobs))
    shape = ChunkStream(fmt, include_usage=include_usage, continuous_usage=continuous_usage,
                        nvext=NvExtReply.of(req.nvext, [prompt_ids], state.decode_prompt))
    await respond(gen, shape, stream=req.stream, receive=http.receive, send=http.send,
                  keepalive_s=state.settings.http.sse_keepalive_s)
