"""Benchmark workloads: random prompts of exact token lengths, and a small conversational set.

Lengths are counted with a local `tokenizers` tokenizer and without special tokens, as vLLM's
random dataset counts them. For /v1/chat/completions the length is the message content's
token count; the server adds its chat template around it.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

CONVERSATIONS_PATH = Path(__file__).parents[1] / "data" / "conversations.jsonl"
_MAX_FIXUP_ROUNDS = 10


@dataclass(slots=True)
class SampleRequest:  # vLLM's name; one prompt of the workload
    prompt: str
    prompt_len: int  # tokens in `prompt`, no special tokens
    expected_output_len: int  # max_tokens to ask for


def default_tokenizer_path() -> Path:
    from rill.engine_proc.model.bundled import ensure_bundled_model

    return ensure_bundled_model()


@functools.lru_cache(maxsize=4)
def load_tokenizer(path: str | None = None) -> Tokenizer:
    """A tokenizer.json file, or a model directory holding one; None means the bundled model's."""
    location = Path(path) if path else default_tokenizer_path()
    if location.is_dir():
        location = location / "tokenizer.json"
    return Tokenizer.from_file(str(location))


def count_tokens(tokenizer: Tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def sample_lens(rng: np.random.Generator, num: int, target_len: int, range_ratio: float,
                min_len: int) -> np.ndarray:
    """Lengths uniform on [floor(len * (1 - r)), ceil(len * (1 + r))], as vLLM samples them."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"random_range_ratio must be in [0, 1), got {range_ratio}")
    low = max(math.floor(target_len * (1 - range_ratio)), min_len)
    high = max(math.ceil(target_len * (1 + range_ratio)), low)
    return rng.integers(low, high + 1, size=num)


def _normal_token_ids(tokenizer: Tokenizer) -> np.ndarray:
    """Every id except added/special tokens, so prompts never carry control tokens."""
    special = set(tokenizer.get_added_tokens_decoder())
    return np.array([i for i in range(tokenizer.get_vocab_size()) if i not in special], dtype=np.int64)


@functools.lru_cache(maxsize=4)
def _single_token_words(tokenizer: Tokenizer) -> tuple[str, ...]:
    """' word' pieces that always encode as one token: the fallback that cannot miss."""
    words = []
    for token, token_id in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        text = tokenizer.decode([token_id])
        if len(text) > 2 and text[0] == " " and text[1:].isascii() and text[1:].isalpha():
            if tokenizer.encode(text, add_special_tokens=False).ids == [token_id]:
                words.append(text)
    if not words:
        raise ValueError("the tokenizer has no single-token words to build exact-length prompts from")
    return tuple(words)


def exact_len_text(tokenizer: Tokenizer, ids: list[int], target_len: int,
                   rng: np.random.Generator, pool: np.ndarray) -> str:
    """Text whose re-encoding is exactly `target_len` tokens, starting from random ids.

    The server re-tokenizes our text, and decode(ids) need not encode back to len(ids) tokens
    (pieces merge or split at their seams), so iterate decode -> encode -> cut or pad.
    """
    for _ in range(_MAX_FIXUP_ROUNDS):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) == target_len:
            return text
        if len(ids) > target_len:
            ids = ids[:target_len]
        else:
            ids = ids + rng.choice(pool, size=target_len - len(ids)).tolist()
    # Byte-level BPE splits before each space, so ' word' pieces never merge with neighbours.
    words = _single_token_words(tokenizer)
    text = "".join(words[i] for i in rng.integers(0, len(words), size=target_len))
    if count_tokens(tokenizer, text) != target_len:
        raise ValueError(f"could not build a prompt of exactly {target_len} tokens with this tokenizer")
    return text


def sample_random(tokenizer: Tokenizer, num_prompts: int, input_len: int, output_len: int,
                  range_ratio: float = 0.0, prefix_len: int = 0, seed: int = 0) -> list[SampleRequest]:
    """vLLM's `random` dataset, but every prompt is exactly prompt_len tokens long."""
    rng = np.random.default_rng(seed)
    pool = _normal_token_ids(tokenizer)
    input_lens = sample_lens(rng, num_prompts, input_len, range_ratio, min_len=0 if prefix_len else 1)
    output_lens = sample_lens(rng, num_prompts, output_len, range_ratio, min_len=1)
    prefix_ids = rng.choice(pool, size=prefix_len).tolist()
    requests = []
    for input_len_i, output_len_i in zip(input_lens.tolist(), output_lens.tolist()):
        target_len = prefix_len + input_len_i
        ids = prefix_ids + rng.choice(pool, size=input_len_i).tolist()
        text = exact_len_text(tokenizer, ids, target_len, rng, pool)
        requests.append(SampleRequest(text, target_len, output_len_i))
    return requests


def load_conversations(path: str | Path | None = None) -> list[dict]:
    """Rows of {"prompt": str, "output_len": int} from a JSONL file (the bundled set by default)."""
    rows = []
    with open(path or CONVERSATIONS_PATH, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
                raise ValueError(f"{path or CONVERSATIONS_PATH}:{line_no}: needs a non-empty \"prompt\"")
            rows.append(row)
    if not rows:
        raise ValueError(f"{path or CONVERSATIONS_PATH}: no prompts")
    return rows


def sample_conversations(tokenizer: Tokenizer, num_prompts: int, output_len: int | None = None,
                         path: str | Path | None = None, seed: int = 0,
                         default_output_len: int = 128) -> list[SampleRequest]:
    """Shuffled prompts from the set, cycled when more are asked for than it holds."""
    rows = load_conversations(path)
    order = np.random.default_rng(seed).permutation(len(rows)).tolist()
    requests = []
    for i in range(num_prompts):
        row = rows[order[i % len(rows)]]
        row_output_len = output_len or int(row.get("output_len") or default_output_len)
        requests.append(SampleRequest(row["prompt"], count_tokens(tokenizer, row["prompt"]), row_output_len))
    return requests
