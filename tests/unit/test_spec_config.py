"""`--speculative-config`: vLLM's JSON, its defaults, and what `rill serve` refuses with exit 2."""
from __future__ import annotations

import argparse

import pytest

from rill.cli import serve_parser
from rill.engine_proc.spec.build import describe
from rill.engine_proc.spec.config import parse_speculative_config


def parse(*argv: str):
    return serve_parser(argparse.ArgumentParser().add_subparsers()).parse_args(list(argv))


def test_ngram_defaults_as_vllm():
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3}')
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (5, 5)
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert (config.prompt_lookup_min, config.prompt_lookup_max) == (4, 4)
    config = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,'
                                      ' "prompt_lookup_max": 6, "disable_by_batch_size": 8}')
    assert describe(config) == "ngram k=3 n=2..6, off above 8 running"
    assert parse_speculative_config("") is None


def test_a_model_without_a_method_is_a_draft_model(tmp_path):
    config = parse_speculative_config(f'{{"model": "{tmp_path}", "num_speculative_tokens": 2}}')
    assert config.method == "draft_model" and describe(config) == f"draft_model {tmp_path} k=2"


@pytest.mark.parametrize("text, message", [
    ("{nope", "not JSON"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method 'eagle' is not supported"),
    ('{"method": "ngram"}', "num_speculative_tokens must be from 1 to 16"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
     "prompt_lookup_min <= prompt_lookup_max"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "typo": 1}', "unknown field `typo`"),
    ('{"method": "draft_model", "num_speculative_tokens": 2}', "needs 'model'"),
    ('{"method": "draft_model", "model": "/nowhere", "num_speculative_tokens": 2}', "no config.json"),
    ('[1]', "must be a JSON object"),
])
def test_bad_configs_exit_2_naming_the_key(text, message, capsys):
    with pytest.raises(SystemExit) as exc:
        parse("--speculative-config", text)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--speculative-config" in err and message in err, err
