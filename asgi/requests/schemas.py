"""Request bodies of the OpenAI routes, decoded and range-checked by msgspec at the edge.

Unknown fields are ignored (SDKs send extras). Fields that a later version will implement are
declared so that a request using them gets a 400 naming them (see `reject_unsupported`),
never a silent ignore.
"""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError, from_validation_error, not_found, unsupported
from rill.asgi.requests.body import decode_json
from rill.asgi.requests.bounds import (
    MAX_ALLOWED_TOKEN_IDS,
    MAX_BAD_WORD_LEN,
    MAX_BAD_WORDS,
    MAX_CHAT_DOCUMENTS,
    MAX_CHAT_TEMPLATE_LEN,
    MAX_CHOICES,
    MAX_CONTENT_PARTS,
    MAX_LOGIT_BIAS,
    MAX_MESSAGES,
    MAX_NAME_LEN,
    MAX_PROMPTS,
    MAX_SMALL_LIST,
    MAX_STOP,
    MAX_STOP_TOKEN_IDS,
    MAX_TEMPLATE_KWARGS,
    MAX_TOOL_CALLS,
    MAX_TOOLS,
    LogprobsCount,
    Metadata,
    Name,
    StopString,
    TruncatePromptTokens,
)
from rill.asgi.requests.cache_salt import CacheSalt
from rill.asgi.requests.nvext import NvExt
from rill.asgi.requests.prediction import Prediction
from rill.asgi.requests.priority import Priority

PositiveInt = Annotated[int, Meta(ge=1)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(gt=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
# Integers that travel to the engine are bounded to int64: msgpack cannot carry more, and the
# engine builds int64 tensors of them (a larger top_k would fail the whole batch's step).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class StreamOptions(msgspec.Struct):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ImageURL(msgspec.Struct):
    url: str  # a base64 data URL (asgi/prompt/images.py): bounded by --max-request-body
    detail: Name | None = None  # OpenAI's resolution hint; the model's processor sets the size


class ContentPart(msgspec.Struct):
    type: Name
    text: str | None = None
    image_url: ImageURL | None = None  # a vision model's image (docs/vision.md)


class FunctionCall(msgspec.Struct):
    name: Name
    # A JSON string in OpenAI's API; an object is taken too (as vLLM does).
    arguments: str | dict[str, Any] | None = None


class ToolCall(msgspec.Struct):
    function: FunctionCall
    id: Name | None = None
    type: Name = "function"


class ChatMessage(msgspec.Struct):
    role: Name
    content: str | Annotated[list[ContentPart], Meta(max_length=MAX_CONTENT_PARTS)] | None = None
    name: Name | None = None
    tool_calls: Annotated[list[ToolCall], Meta(max_length=MAX_TOOL_CALLS)] | None = None
    tool_call_id: Name | None = None
    # An assistant turn's earlier thinking, for templates that show it (vLLM takes both names).
    reasoning_content: str | None = None
    reasoning: str | None = None


class FunctionDefinition(msgspec.Struct):
    name: Name
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(msgspec.Struct):
    type: Name
    function: FunctionDefinition | None = None


class FunctionName(msgspec.Struct):
    name: Name


class NamedToolChoice(msgspec.Struct):
    type: Name
    function: FunctionName


class SamplingFields(msgspec.Struct, kw_only=True):
    """What chat and completions share."""

    model: str
    # OpenAI's spec makes `stream` (and completions' `echo`) nullable: null is the default, false.
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: PositiveInt | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT64_MAX)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None  # vLLM's extension
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # vLLM's extension; vLLM takes any value > 0, this server caps it at 2 (a deliberate divergence).
    repetition_penalty: Annotated[float, Meta(gt=0, le=2)] | None = None
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Meta(ge=0, le=INT64_MAX)]],
                              Meta(max_length=MAX_STOP_TOKEN_IDS)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Meta(ge=0, le=INT64_MAX)] = 0
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    user: Name | None = None
    n: Annotated[int, Meta(ge=1, le=128)] | None = None
    # Token id (as a string, JSON keys being strings) -> added to its logit; ids checked in sampling.py.
    logit_bias: Annotated[dict[str, Annotated[float, Meta(ge=-100, le=100)]],
                          Meta(max_length=MAX_LOGIT_BIAS)] | None = None
    # Structured outputs, checked and turned into one StructuredSpec by asgi/requests/structured.py.
    response_format: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None
    nvext: NvExt | None = None  # NVIDIA Dynamo's extension (asgi/requests/nvext.py)
    # vLLM's extension: each prompt token's logprob and the top k (not streamed, as vLLM).
    prompt_logprobs: LogprobsCount | None = None
    cache_salt: CacheSalt | None = None  # vLLM's: a namespace of its own in the prefix cache (asgi/requests/cache_salt.py)
    priority: Priority = 0  # vLLM's: lower runs first, under --scheduling-policy priority (asgi/requests/priority.py)
    # vLLM's: keep the prompt's last k tokens (-1: the context length; asgi/prompt/truncation.py)
    truncate_prompt_tokens: TruncatePromptTokens | None = None
    # vLLM's: the prompt's and each choice's token ids in the answer (docs/endpoints.md)
    return_token_ids: bool | None = None
    # vLLM's: the tokenizer's special tokens around the prompt (default: chat no, the template writes its own;
    # completions yes)
    add_special_tokens: bool | None = None
    return_tokens_as_token_ids: bool | None = None  # vLLM's: logprobs name tokens "token_id:N" (token_text.py)
    # vLLM's: sample only these tokens (ids checked in sampling.py)
    allowed_token_ids: Annotated[list[Annotated[int, Meta(ge=0, le=INT64_MAX)]],
                                 Meta(min_length=1, max_length=MAX_ALLOWED_TOKEN_IDS)] | None = None
    # vLLM's: words never written (asgi/requests/bad_words.py)
    bad_words: Annotated[list[Annotated[str, Meta(min_length=1, max_length=MAX_BAD_WORD_LEN)]],
                         Meta(max_length=MAX_BAD_WORDS)] | None = None
    # vLLM's beam search: `n` beams, scored by summed logprob over length ** length_penalty (asgi/requests/beam_search.py)
    use_beam_search: bool | None = None
    length_penalty: Annotated[float, Meta(ge=-10, le=10)] = 1.0
    early_stopping: bool = False
    # vLLM's, not served: a 400 rather than an answer that silently is not what was asked
    logits_processors: Any = None


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: PositiveInt | None = None
    add_generation_prompt: bool | None = None  # None: true, unless continue_final_message
    chat_template_kwargs: Annotated[dict[str, Any], Meta(max_length=MAX_TEMPLATE_KWARGS)] | None = None
    logprobs: bool | None = None
    top_logprobs: LogprobsCount | None = None
    tools: Annotated[list[Tool], Meta(max_length=MAX_TOOLS)] | None = None
    tool_choice: Name | NamedToolChoice | None = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: bool | None = None
    continue_final_message: bool = False
    echo: bool = False  # vLLM's: the answer opens with the last message's text, if that message is the assistant's
    chat_template: Annotated[str, Meta(max_length=MAX_CHAT_TEMPLATE_LEN)] | None = None
    # vLLM's: documents a RAG chat template renders (Granite's, Command R's), each a few named strings
    documents: Annotated[list[Annotated[dict[Name, str], Meta(max_length=MAX_SMALL_LIST)]],
                         Meta(max_length=MAX_CHAT_DOCUMENTS)] | None = None
    reasoning_effort: Name | None = None  # asgi/requests/thinking.py
    thinking_token_budget: Annotated[int, Meta(ge=0)] | None = None  # vLLM's name
    audio: Any = None
    modalities: Annotated[list[Name], Meta(max_length=MAX_SMALL_LIST)] | None = None
    prediction: Prediction | None = None  # asgi/requests/prediction.py
    web_search_options: Any = None
    store: bool | None = None  # kept for the stored completions' routes (asgi/routes/stored_chats.py)
    metadata: Metadata | None = None  # kept with them


def echoed_text(req: ChatCompletionRequest) -> str:
    """vLLM's chat `echo`: the text of the last message when it is the assistant's (the answer's role), else ""."""
    last = req.messages[-1]
    if not req.echo or last.role != "assistant":
        return ""
    if isinstance(last.content, list):
        return "\n".join(part.text for part in last.content if part.type == "text" and part.text)
    return last.content or ""


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[Any]
    max_tokens: Annotated[int, Meta(ge=0)] | None = None  # 0 with `echo`: score the prompt only
    logprobs: LogprobsCount | None = None
    echo: bool | None = False
    best_of: Annotated[int, Meta(ge=1, le=20)] | None = None  # OpenAI's legacy field (asgi/requests/best_of.py)
    suffix: str | None = None


chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
completion_decoder = msgspec.json.Decoder(CompletionRequest)


def decode_request(decoder: msgspec.json.Decoder, body: bytes):
    """Decode and check a request body: 400 naming the parameter (the model: asgi/requests/model_choice.py)."""
    req = decode_json(decoder, body)
    reject_unsupported(req)
    if req.nvext is not None:
        req.nvext.check(chat=isinstance(req, ChatCompletionRequest))
    return req


def unknown_model(model: str) -> APIError:
    """The 404 for a model this server does not serve. `model` has no length bound (no name longer
    than the served ones can match, so a long one is a 404 too), but only its start is echoed."""
    shown = model if len(model) <= MAX_NAME_LEN else model[:MAX_NAME_LEN] + "..."
    return not_found(f"The model `{shown}` does not exist.", param="model")


def reject_unsupported(req: SamplingFields) -> None:
    """400 for every parameter this server does not implement yet, naming it."""
    checks: list[tuple[str, bool]] = [("logits_processors", bool(req.logits_processors))]
    if isinstance(req, ChatCompletionRequest):
        checks += [
            ("functions", bool(req.functions)),
            ("function_call", req.function_call not in (None, "none")),
            ("audio", req.audio is not None),
            ("modalities", req.modalities not in (None, ["text"])),
            ("web_search_options", req.web_search_options is not None),
        ]
    for param, used in checks:
        if used:
            raise unsupported(param)
    if isinstance(req, ChatCompletionRequest) and req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "`top_logprobs` needs `logprobs` set to true.", param="top_logprobs")
    if isinstance(req, CompletionRequest) and req.max_tokens == 0 and not req.echo:
        raise APIError(400, "`max_tokens` must be at least 1, or 0 with `echo` (to score the prompt only).",
                       param="max_tokens")
    if req.prompt_logprobs is not None and req.stream:
        raise APIError(400, "`prompt_logprobs` is not available when `stream` is true.", param="prompt_logprobs")
    if req.stream_options is not None and not req.stream:
        raise APIError(400, "`stream_options` is only allowed when `stream` is true.", param="stream_options")


def stream_usage(req: SamplingFields) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats): vLLM's continuous stats need include_usage too."""
    opts = req.stream_options
    include = bool(req.stream and opts and opts.include_usage)
    return include, include and opts.continuous_usage_stats


def chat_from(body: dict[str, Any], param: str) -> ChatCompletionRequest:
    """The chat request another API's request was translated into (the Responses and Messages
    APIs), checked as chat checks its own; a 400 names `param`, the other API's field."""
    try:
        return msgspec.convert(body, ChatCompletionRequest)
    except msgspec.ValidationError as exc:
        err = from_validation_error(exc)
        err.param = param
        raise err from None


def stop_strings(req: SamplingFields) -> list[str]:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if any(not s for s in stop):
        raise APIError(400, "Stop strings must not be empty.", param="stop")
    return stop


def prompt_batch(prompt: str | list[Any], param: str = "prompt") -> list[str] | list[list[int]]:
    """A completions prompt (or embeddings input, `param`) as a list of strings or of token-id lists,
    at most MAX_PROMPTS of them (one list of token ids is one prompt, bounded by the context)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise APIError(400, f"`{param}` must not be empty.", param=param)
    if len(prompt) > MAX_PROMPTS and not isinstance(prompt[0], int):
        raise APIError(400, f"`{param}` holds {len(prompt)} prompts; at most {MAX_PROMPTS} per request.",
                       param=param)
    if all(isinstance(x, str) for x in prompt):
        return prompt
    if all(isinstance(x, int) and not isinstance(x, bool) for x in prompt):
        return [prompt]
    if all(isinstance(x, list) and x and all(isinstance(t, int) and not isinstance(t, bool) for t in x) for x in prompt):
        return prompt
    raise APIError(400, f"`{param}` must be a string, a list of strings, a list of token ids, "
                        "or a list of lists of token ids.", param=param)


def check_choices(num_prompts: int, n: int) -> None:
    """A completions request's choices (prompts x n) are engine requests, each with its objects in
    this worker: at most MAX_CHOICES, checked before any prompt is tokenized."""
    if num_prompts * n > MAX_CHOICES:
        raise APIError(400, f"{num_prompts} prompts with `n` {n} ask for {num_prompts * n} choices; at most "
                            f"{MAX_CHOICES} per request.", param="n" if n > 1 else "prompt")
