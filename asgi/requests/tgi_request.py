"""Text Generation Inference's native request (`POST /generate`, `/generate_stream` and `/`: what huggingface_hub's
`InferenceClient.text_generation` and TGI's own client send), checked field by field and mapped onto a completion
request. `do_sample` false (TGI's default) is greedy unless a sampling field asks otherwise, as in TGI.
`watermark`, `typical_p` and `decoder_input_details` are refused (400s naming them); `truncate` keeps the
prompt's last tokens, as TGI's does."""
from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from rill.asgi.errors import APIError, unsupported
from rill.asgi.requests.bounds import MAX_STOP, Name, StopString
from rill.asgi.requests.schemas import INT64_MAX, INT64_MIN, CompletionRequest, Penalty

DEFAULT_MAX_NEW_TOKENS = 100  # TGI's


class Grammar(msgspec.Struct):
    type: Literal["json", "regex"]
    value: Any


class TGIParameters(msgspec.Struct, kw_only=True):
    do_sample: bool = False
    max_new_tokens: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None
    temperature: Annotated[float, Meta(gt=0, le=2)] | None = None
    top_k: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None
    top_p: Annotated[float, Meta(gt=0, lt=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0, le=2)] | None = None
    frequency_penalty: Penalty | None = None
    seed: Annotated[int, Meta(ge=INT64_MIN, le=INT64_MAX)] | None = None
    stop: Annotated[list[StopString], Meta(max_length=MAX_STOP)] | None = None
    return_full_text: bool = False
    details: bool = False
    truncate: Annotated[int, Meta(ge=1, le=INT64_MAX)] | None = None
    grammar: Grammar | None = None
    best_of: Annotated[int, Meta(ge=1, le=1)] | None = None  # TGI's best_of > 1 is not served
    top_n_tokens: Annotated[int, Meta(ge=0, le=0)] | None = None
    adapter_id: Name | None = None
    typical_p: float | None = None
    watermark: bool = False
    decoder_input_details: bool = False


class TGIRequest(msgspec.Struct, kw_only=True):
    inputs: str
    parameters: TGIParameters | None = None
    stream: bool = False


tgi_decoder = msgspec.json.Decoder(TGIRequest)
# A completion's fields as TGI names them, for the 400s of the checks they share
TGI_NAMES = {"max_tokens": "parameters.max_new_tokens", "guided_json": "parameters.grammar",
             "guided_regex": "parameters.grammar", "temperature": "parameters.temperature",
             "repetition_penalty": "parameters.repetition_penalty", "seed": "parameters.seed",
             "stop": "parameters.stop", "truncate_prompt_tokens": "parameters.truncate"}


def as_completion(req: TGIRequest, model: str) -> CompletionRequest:
    p = req.parameters or TGIParameters()
    for name, used in (("typical_p", p.typical_p is not None), ("watermark", p.watermark),
                       ("decoder_input_details", p.decoder_input_details)):
        if used:
            raise unsupported(f"parameters.{name}")
    if not req.inputs:
        raise APIError(400, "`inputs` must not be empty.", param="inputs")
    sampling = p.do_sample or any(v is not None for v in (p.temperature, p.top_k, p.top_p))
    grammar = p.grammar
    return CompletionRequest(
        model=model, prompt="", max_tokens=p.max_new_tokens or DEFAULT_MAX_NEW_TOKENS,
        temperature=(p.temperature if p.temperature is not None else 1.0) if sampling else 0.0,
        top_k=p.top_k, top_p=p.top_p, repetition_penalty=p.repetition_penalty, frequency_penalty=p.frequency_penalty,
        seed=p.seed, stop=p.stop, truncate_prompt_tokens=p.truncate,
        guided_json=grammar.value if grammar is not None and grammar.type == "json" else None,
        guided_regex=grammar.value if grammar is not None and grammar.type == "regex" else None)
