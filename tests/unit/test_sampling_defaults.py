"""The model's sampling defaults (asgi/requests/sampling_defaults.py): read from generation_config.json
(a GGUF's general.sampling.* land there), ignored with --generation-config vllm, overridden by
--override-generation-config, applied only where a request leaves a field out."""
from __future__ import annotations

import argparse
import json
import logging

import gguf
import msgspec
import pytest

from rill.asgi.requests.sampling import sampling_params
from rill.asgi.requests.sampling_defaults import DefaultsError, parse_override, sampling_defaults
from rill.asgi.requests.schemas import CompletionRequest
from rill.chat_flags import check_chat_flags
from rill.cli import serve_parser
from rill.engine_proc.model.gguf_dir import gguf_sampling
from tests.helpers.gguf_files import tiny_model, write_gguf

QWEN3 = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0, "do_sample": True, "bos_token_id": 1}


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(QWEN3))
    return tmp_path


def test_the_models_fields_then_the_override(model_dir, tmp_path_factory):
    assert sampling_defaults(model_dir) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    assert sampling_defaults(model_dir, "vllm") == sampling_defaults(model_dir, "none") == {}
    other = tmp_path_factory.mktemp("other")
    (other / "generation_config.json").write_text('{"repetition_penalty": 1.1}')
    assert sampling_defaults(model_dir, str(other)) == {"repetition_penalty": 1.1}
    assert sampling_defaults(model_dir, "auto", '{"temperature": 0.2, "top_k": -1}')["temperature"] == 0.2
    assert sampling_defaults(model_dir, "vllm", '{"min_p": 0.05}') == {"min_p": 0.05}
    assert sampling_defaults(tmp_path_factory.mktemp("none")) == {}  # no file: Rill's defaults


def test_a_models_value_a_request_could_not_send_is_dropped_with_a_warning(tmp_path, caplog):
    (tmp_path / "generation_config.json").write_text('{"temperature": 7.0, "top_p": 0.9, "top_k": 2.5}')
    with caplog.at_level(logging.WARNING, logger="rill.api"):
        assert sampling_defaults(tmp_path) == {"top_p": 0.9}
    assert "temperature = 7.0 is outside" in caplog.text and "top_k must be an integer" in caplog.text


@pytest.mark.parametrize("text, message", [
    ('{"temprature": 0.5}', "'temprature' is not a sampling default"),
    ('{"top_p": 0}', "outside (0.0, 1.0]"),
    ('{"temperature": true}', "must be a number"),
    ('{"temperature": NaN}', "outside"),
    ("[0.5]", "a JSON object"),
    ("{temperature: 1}", "not JSON"),
])
def test_a_bad_override_is_refused(text, message):
    with pytest.raises(DefaultsError, match=message.replace("(", r"\(").replace("[", r"\[").replace("]", r"\]")):
        parse_override(text)


@pytest.mark.parametrize("argv, message", [
    (("--override-generation-config", '{"top_k": "20"}'), "--override-generation-config: top_k must be an integer"),
    (("--generation-config", "/nowhere"), "--generation-config: '/nowhere' is not auto, vllm, none or a folder"),
])
def test_bad_flags_exit_2_at_start(argv, message, capsys):
    parser = serve_parser(argparse.ArgumentParser().add_subparsers())
    with pytest.raises(SystemExit) as exc:
        check_chat_flags(parser.parse_args(list(argv)), parser)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_defaults_fill_only_what_the_request_leaves_out(model_dir):
    defaults = sampling_defaults(model_dir)
    params = lambda body: sampling_params(  # noqa: E731
        msgspec.json.decode(json.dumps({"model": "m", "prompt": "x", **body}), type=CompletionRequest),
        max_tokens=4, prompt_len=1, max_model_len=64, prompt_param="prompt", vocab_size=100, defaults=defaults)
    left_out = params({})
    assert (left_out.temperature, left_out.top_p, left_out.top_k, left_out.min_p) == (0.6, 0.95, 20, 0.0)
    assert left_out.repetition_penalty == 1.0  # the model sets none: Rill's
    sent = params({"temperature": 0, "top_p": 1.0, "top_k": -1, "min_p": 0.1})
    assert (sent.temperature, sent.top_p, sent.top_k, sent.min_p) == (0.0, 1.0, 0, 0.1)
    without = sampling_params(msgspec.json.decode(b'{"model": "m", "prompt": "x"}', type=CompletionRequest),
                              max_tokens=4, prompt_len=1, max_model_len=64, prompt_param="prompt", vocab_size=100)
    assert (without.temperature, without.top_p, without.top_k) == (1.0, 1.0, 0)


def test_a_ggufs_general_sampling_fields_are_read_under_generation_configs_names(tmp_path):
    path = write_gguf(tiny_model(), tmp_path / "t.gguf", gguf.GGMLQuantizationType.F32,
                      sampling={"temp": 0.25, "top_k": 30, "top_p": 0.5, "penalty_repeat": 1.25, "mirostat": 0})
    assert gguf_sampling(path) == {"temperature": 0.25, "top_k": 30, "top_p": 0.5, "repetition_penalty": 1.25}
