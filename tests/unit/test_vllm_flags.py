"""`vllm serve`'s flags on `rill serve`: --seed reaches the engine's config; the others are taken and said to do
nothing, with why; a flag Rill does not take is still refused by argparse."""
from __future__ import annotations

import argparse
import io

import pytest

from rill.cli import serve_parser
from rill.config_args import config_from_args
from rill.vllm_flags import NO_EFFECT, check_vllm_flags


def serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_a_vllm_command_line_parses_and_says_what_does_nothing():
    args = serve_args("--trust-remote-code", "--gpu-memory-utilization", "0.9", "--swap-space", "4",
                      "--disable-log-requests", "--no-enable-chunked-prefill", "--uvicorn-log-level", "warning",
                      "--seed", "7", "--served-model-name", "m")
    said = io.StringIO()
    given = check_vllm_flags(args, said)
    assert given == ["--trust-remote-code", "--disable-log-requests", "--enable-chunked-prefill", "--swap-space",
                     "--gpu-memory-utilization", "--uvicorn-log-level"]  # NO_EFFECT's order
    for flag in given:
        assert f"{flag} (vLLM's) has no effect here: {NO_EFFECT[flag][1]}" in said.getvalue()
    assert check_vllm_flags(serve_args(), io.StringIO()) == []


def test_seed_reaches_the_engines_model_config(tmp_path):
    assert config_from_args(serve_args("--seed", "7"), tmp_path, "m").engine.model.seed == 7
    assert config_from_args(serve_args(), tmp_path, "m").engine.model.seed is None


def test_max_logprobs_reaches_the_workers_and_bounds_a_request(tmp_path):
    """vLLM's --max-logprobs: 20 by default, -1 the whole vocabulary; below -1 is refused at start."""
    from rill.asgi.errors import APIError
    from rill.asgi.requests.sampling import sampling_params
    from rill.asgi.requests.schemas import CompletionRequest

    assert config_from_args(serve_args(), tmp_path, "m").http.max_logprobs == 20
    assert config_from_args(serve_args("--max-logprobs", "-1"), tmp_path, "m").http.max_logprobs == -1
    with pytest.raises(SystemExit):
        serve_args("--max-logprobs", "-2")
    req = CompletionRequest(model="m", prompt="x")
    params = lambda count, most: sampling_params(  # noqa: E731
        req, max_tokens=1, prompt_len=1, max_model_len=8, prompt_param="prompt", vocab_size=100, logprobs=count,
        max_logprobs=most)
    assert params(100, -1).logprobs == 100 and params(20, 20).logprobs == 20
    for count, most in ((101, -1), (21, 20), (101, 500)):  # never past the vocabulary
        with pytest.raises(APIError, match="at most"):
            params(count, most)


def test_a_flag_rill_does_not_take_is_refused():
    with pytest.raises(SystemExit) as exc:
        serve_args("--tokenizer", "other/tokenizer")
    assert exc.value.code == 2


def test_the_model_where_vllm_serve_takes_it(tmp_path):
    """`rill serve MODEL --flags`, as `vllm serve MODEL --flags`: the same as --model."""
    from rill.cli import main

    model = tmp_path / "model"
    with pytest.raises(SystemExit) as exc:  # parsed, then refused at resolve_model: no config.json there
        main(["serve", str(model), "--port", "0", "--trust-remote-code"])
    assert "no config.json" in str(exc.value.code) and str(model) in str(exc.value.code)
    with pytest.raises(SystemExit) as twice:
        main(["serve", str(model), "--model", str(tmp_path / "other")])
    assert twice.value.code == 2


def test_vllms_names_for_rills_log_flags():
    args = serve_args("--enable-log-requests", "--disable-uvicorn-access-log")
    assert args.log_requests is True and args.access_log is False
    assert serve_args().access_log is True and serve_args().log_requests is False
