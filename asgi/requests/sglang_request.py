"""SGLang's native `POST /generate` request (its Python and HTTP clients', `sglang.bench_serving --backend sglang`,
RL rollout loops), checked field by field and mapped onto a completion request. `sampling_params` takes SGLang's
names; `rid`, `return_text_in_logprobs`, `no_stop_trim` and the like are ignored, as unknown fields are;
`return_logprob`, `image_data` and a batch streamed are 400s naming them."""
from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError, unsupported
from rill.asgi.requests.bounds import MAX_CONSTRAINT_LEN, MAX_PROMPTS, MAX_STOP, MAX_STOP_TOKEN_IDS, StopString
from rill.asgi.requests.schemas import INT64_MAX, INT64_MIN, CompletionRequest, Penalty

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's


class SGLangSampling(msgspec.Struct, kw_only=True):
    max_new_tokens: Annotated[int, Meta(ge=0, le=INT64_MAX)] | None = None
    min_new_tokens: Annotated[int, Meta(ge=0, le=INT64_MAX)] = 0
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    top_k: Annotated[int, Meta(ge=-1, le=INT64_MAX)] | None = None  # -1: every token
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Meta(gt=0, le=2)] | None = None
    stop: StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Meta(ge=0, le=INT64_MAX)]], Meta(max_length=MAX_STOP_TOKEN_IDS)] \
        | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None  # SGLang's sampling_seed
    sampling_seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    json_schema: Annotated[str, Meta(max_length=MAX_CONSTRAINT_LEN)] | None = None
    regex: Annotated[str, Meta(max_length=MAX_CONSTRAINT_LEN)] | None = None
    ebnf: Annotated[str, Meta(max_length=MAX_CONSTRAINT_LEN)] | None = None


class GenerateRequest(msgspec.Struct, kw_only=True):
    text: str | Annotated[list[str], Meta(max_length=MAX_PROMPTS)] | None = None
    input_ids: Annotated[list[Any], Meta(max_length=MAX_PROMPTS)] | None = None  # ids, or a list of them
    sampling_params: SGLangSampling | None = None
    stream: bool = False
    model: str | None = None  # Rill's: the served model or a LoRA adapter (SGLang's lora_path, too)
    lora_path: str | None = None
    return_logprob: bool = False
    image_data: Any = None


generate_decoder = msgspec.json.Decoder(GenerateRequest)
# A completion's fields as SGLang names them, for the 400s of the checks they share
SGLANG_NAMES = {"max_tokens": "sampling_params.max_new_tokens", "guided_json": "sampling_params.json_schema",
                "guided_regex": "sampling_params.regex", "guided_grammar": "sampling_params.ebnf",
                "min_tokens": "sampling_params.min_new_tokens"}


def prompts_of(req: GenerateRequest) -> tuple[list[str] | list[list[int]], bool]:
    """The prompts (texts or token-id lists), and whether the request was a batch (a list answers a list)."""
    if req.image_data is not None:
        raise unsupported("image_data")
    if req.return_logprob:
        raise unsupported("return_logprob")
    if (req.text is None) == (req.input_ids is None):
        raise APIError(400, "Give the prompt as `text` or as `input_ids`, once.", param="text")
    if req.text is not None:
        batch = isinstance(req.text, list)
        prompts = req.text if batch else [req.text]
    else:
        batch = bool(req.input_ids) and isinstance(req.input_ids[0], list)
        prompts = req.input_ids if batch else [req.input_ids]
        if not all(isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
                   for ids in prompts):
            raise APIError(400, "`input_ids` must be token ids, or lists of them.", param="input_ids")
    if not prompts:
        raise APIError(400, "The prompt must not be empty.", param="text" if req.text is not None else "input_ids")
    if batch and req.stream:
        raise APIError(400, "A batch of prompts is answered whole: send `stream` false, or one prompt.",
                       param="stream")
    return prompts, batch


def as_completion(req: GenerateRequest, model: str) -> CompletionRequest:
    """The completion request each prompt runs as (its sampling fields checked as completions' are)."""
    s = req.sampling_params or SGLangSampling()
    stop = [s.stop] if isinstance(s.stop, str) else s.stop
    return CompletionRequest(
        model=model, prompt="", max_tokens=s.max_new_tokens if s.max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS,
        min_tokens=s.min_new_tokens, temperature=s.temperature, top_p=s.top_p,
        top_k=s.top_k if s.top_k not in (-1, 0) else None, min_p=s.min_p, frequency_penalty=s.frequency_penalty,
        presence_penalty=s.presence_penalty, repetition_penalty=s.repetition_penalty, stop=stop,
        stop_token_ids=s.stop_token_ids, ignore_eos=s.ignore_eos, skip_special_tokens=s.skip_special_tokens,
        seed=s.sampling_seed if s.sampling_seed is not None else s.seed, guided_json=s.json_schema,
        guided_regex=s.regex, guided_grammar=s.ebnf)
