"""`--speculative-config`: vLLM's JSON object, checked once at start with a message naming the key."""
from __future__ import annotations

import msgspec

from rill.ipc.config import json_object

METHODS = ("ngram", "draft_model")


class SpeculativeConfig(msgspec.Struct, forbid_unknown_fields=True):
    """What vLLM's `--speculative-config` accepts, for the two methods Rill serves.

    ngram: drafts are copied from the request's own prompt and output after the longest of its
    last prompt_lookup_max .. prompt_lookup_min tokens seen before (both 5 when neither is given,
    as vLLM). draft_model: `model` (a directory of the same tokenizer) drafts greedily.
    disable_by_batch_size: no drafts in a step with more running requests than this (0: never off).
    """

    method: str = ""
    num_speculative_tokens: int = 0
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str = ""
    disable_by_batch_size: int = 0


def parse_speculative_config(text: str) -> SpeculativeConfig | None:
    """The config from its JSON text ("" or "null": none); ValueError naming the key at fault."""
    if not text or text.strip() in ("null", "{}"):
        return None
    raw = json_object(text, not_json="--speculative-config is not JSON: ",
                      not_object="--speculative-config must be a JSON object")
    if not raw.get("method") and raw.get("model"):
        raw["method"] = "draft_model"  # as vLLM: a model and no method is a draft model
    try:
        config = msgspec.convert(raw, SpeculativeConfig)
    except msgspec.ValidationError as exc:
        raise ValueError(f"--speculative-config: {exc}") from None
    return _checked(config)


def _checked(config: SpeculativeConfig) -> SpeculativeConfig:
    if config.method not in METHODS:
        raise ValueError(f"--speculative-config: method {config.method!r} is not supported: {METHODS}")
    if not 1 <= config.num_speculative_tokens <= 16:
        raise ValueError("--speculative-config: num_speculative_tokens must be from 1 to 16")
    if config.disable_by_batch_size < 0:
        raise ValueError("--speculative-config: disable_by_batch_size must be >= 0")
    if config.method == "draft_model":
        if not config.model:
            raise ValueError("--speculative-config: method 'draft_model' needs 'model' (a model directory)")
        if config.prompt_lookup_min is not None or config.prompt_lookup_max is not None:
            raise ValueError("--speculative-config: prompt_lookup_min and prompt_lookup_max are for method 'ngram'")
        return config
    if config.model:
        raise ValueError("--speculative-config: 'model' is for method 'draft_model', not 'ngram'")
    low, high = config.prompt_lookup_min, config.prompt_lookup_max
    if low is None and high is None:
        low = high = 5
    low = high if low is None else low
    high = low if high is None else high
    if low < 1 or high < low:
        raise ValueError("--speculative-config: need 1 <= prompt_lookup_min <= prompt_lookup_max")
    config.prompt_lookup_min, config.prompt_lookup_max = low, high
    return config
