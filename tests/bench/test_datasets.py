"""bench/serving/datasets.py: random prompts of exact token lengths, and the bundled conversations set."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from rill.bench.serving.datasets import (
    CONVERSATIONS_PATH,
    count_tokens,
    exact_len_text,
    load_conversations,
    load_tokenizer,
    sample_conversations,
    sample_random,
)


@pytest.fixture(scope="module")
def tok(model_dir):
    return load_tokenizer(str(model_dir))


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("input_len", [1, 2, 5, 32, 200, 700])
def test_random_prompts_have_exactly_the_requested_length(tok, seed, input_len):
    requests = sample_random(tok, 6, input_len, 8, seed=seed)
    assert len(requests) == 6
    for r in requests:
        assert r.prompt_len == input_len
        assert count_tokens(tok, r.prompt) == input_len  # what the server will count
        assert r.expected_output_len == 8


def test_random_prompts_differ_and_are_reproducible(tok):
    first = sample_random(tok, 5, 40, 8, seed=11)
    again = sample_random(tok, 5, 40, 8, seed=11)
    other = sample_random(tok, 5, 40, 8, seed=12)
    assert [r.prompt for r in first] == [r.prompt for r in again]
    assert len({r.prompt for r in first}) == 5
    assert [r.prompt for r in first] != [r.prompt for r in other]


def test_no_special_tokens_in_random_prompts(tok):
    special = set(tok.get_added_tokens_decoder())
    for r in sample_random(tok, 10, 300, 4, seed=5):
        assert not special & set(tok.encode(r.prompt, add_special_tokens=False).ids)


def test_range_ratio_bounds_both_lengths(tok):
    requests = sample_random(tok, 60, 100, 20, range_ratio=0.5, seed=3)
    input_lens = [r.prompt_len for r in requests]
    output_lens = [r.expected_output_len for r in requests]
    assert all(50 <= n <= 150 for n in input_lens) and len(set(input_lens)) > 10
    assert all(10 <= n <= 30 for n in output_lens) and len(set(output_lens)) > 5
    for r in requests:
        assert count_tokens(tok, r.prompt) == r.prompt_len


def test_range_ratio_rounds_outward_and_keeps_one_token(tok):
    requests = sample_random(tok, 200, 3, 1, range_ratio=0.9, seed=0)
    assert {r.prompt_len for r in requests} <= set(range(1, math.ceil(3 * 1.9) + 1))
    assert min(r.expected_output_len for r in requests) >= 1
    with pytest.raises(ValueError):
        sample_random(tok, 1, 10, 10, range_ratio=1.0)


def test_prefix_is_shared_and_counted(tok):
    requests = sample_random(tok, 4, 16, 4, prefix_len=24, seed=9)
    assert all(r.prompt_len == 40 and count_tokens(tok, r.prompt) == 40 for r in requests)


def test_fix_up_reaches_the_target_from_merging_ids(tok):
    # Single letters decode to "abcdefgh", which encodes as fewer tokens: the fix-up must pad.
    letters = [tok.token_to_id(c) for c in "abcdefgh"]
    assert count_tokens(tok, tok.decode(letters)) < len(letters)
    text = exact_len_text(tok, letters, len(letters), np.random.default_rng(0), np.array(letters))
    assert count_tokens(tok, text) == len(letters)


def test_conversations_file_is_well_formed_and_varied():
    rows = [json.loads(line) for line in CONVERSATIONS_PATH.read_text(encoding="utf-8").splitlines()]
    assert 40 <= len(rows) <= 100
    prompts = [row["prompt"] for row in rows]
    assert len(set(prompts)) == len(prompts)
    assert all(isinstance(row["output_len"], int) and 16 <= row["output_len"] <= 512 for row in rows)
    assert len({row["output_len"] for row in rows}) >= 5
    assert sum(p.endswith("?") for p in prompts) >= 10  # questions, and instructions too
    assert sum(not p.endswith("?") for p in prompts) >= 10
    assert load_conversations() == rows


def test_conversations_sampling(tok):
    rows = load_conversations()
    requests = sample_conversations(tok, len(rows) + 5, seed=1)
    assert len(requests) == len(rows) + 5
    assert {r.prompt for r in requests} == {row["prompt"] for row in rows}  # all used, then cycled
    by_prompt = {row["prompt"]: row["output_len"] for row in rows}
    for r in requests:
        assert r.prompt_len == count_tokens(tok, r.prompt) > 3
        assert r.expected_output_len == by_prompt[r.prompt]
    forced = sample_conversations(tok, 3, output_len=7, seed=1)
    assert [r.expected_output_len for r in forced] == [7, 7, 7]
    assert [r.prompt for r in forced] == [r.prompt for r in requests[:3]]
