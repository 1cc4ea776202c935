"""The transformers fallback runner: transformers' own greedy tokens through the real scheduler."""
from __future__ import annotations

import gc
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rill.engine_proc.model.choice import choose_runner
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from rill.engine_proc.model.hf_runner import TransformersRunner
from rill.engine_proc.model.loader import load_config
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers import scheduled
from tests.helpers.runners import make_runner
from tests.helpers.scheduled import BLOCK_SIZE, EOS_ID, PROMPTS, SHARED, outputs
from tests.helpers.server import start_servers, stop_server
from tests.helpers.tiny_models import tiny_config


@dataclass
class Tiny:
    model_dir: Path
    hf_model: torch.nn.Module
    runner: TransformersRunner
    expected: dict[str, list[int]]  # transformers' greedy continuation of each prompt


@pytest.fixture(scope="module", params=["gpt2", "gpt_neox"])
def tiny(request, tmp_path_factory) -> Tiny:
    """A tiny random model saved by transformers, with its greedy continuation of each prompt."""
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny_config(request.param), dtype=torch.float32).eval()
    with torch.no_grad():
        for param in hf.parameters():  # spread the logits (norms kept at 1: random ones flatten them)
            if param.dim() >= 2:
                param.normal_(0.0, 0.2)
    model_dir = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(model_dir)
    expected = scheduled.hf_continuations(hf)
    runner = make_runner(model_dir, runner_class=TransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID])
    return Tiny(model_dir, hf, runner, expected)


def run_scheduled(tiny: Tiny, arrivals: dict[str, int], **kwargs) -> dict[str, EngineRequest]:
    return scheduled.run_scheduled(tiny.runner, tiny.hf_model, arrivals, **kwargs)


def test_batched_prompts_match_transformers(tiny):
    reqs = run_scheduled(tiny, {"a": 0, "b": 0, "c": 0})
    assert outputs(reqs) == {k: tiny.expected[k] for k in "abc"}


def test_chunked_prefill_mixed_with_decodes_matches_transformers(tiny):
    # A budget of 5 tokens splits every prompt into chunks and mixes them with decodes.
    reqs = run_scheduled(tiny, {"a": 0, "b": 2, "c": 5}, max_num_batched_tokens=5)
    assert outputs(reqs) == {k: tiny.expected[k] for k in "abc"}


@pytest.mark.parametrize("caching", [False, True])
def test_preempted_requests_match_transformers(tiny, caching):
    # 8 blocks of 8 tokens (one reserved) cannot hold the three requests at their full length.
    reqs = run_scheduled(tiny, {"a": 0, "b": 0, "c": 0}, num_blocks=8, caching=caching)
    assert sum(r.num_preemptions for r in reqs.values()) > 0
    assert outputs(reqs) == {k: tiny.expected[k] for k in "abc"}
    if caching:  # a re-admitted request found its own blocks and started past position 0
        assert any(r.num_preemptions and r.num_computed_tokens for r in reqs.values())


def test_prefix_cache_hit_matches_transformers(tiny):
    reqs = run_scheduled(tiny, {"a": 0, "b": 0, "a2": 6}, caching=True)
    assert reqs["a2"].num_cached_tokens == len(SHARED) // BLOCK_SIZE * BLOCK_SIZE
    assert outputs(reqs) == {k: tiny.expected[k] for k in ("a", "b", "a2")}


def test_cache_out_of_step_with_start_pos_is_rebuilt(tiny):
    runner = tiny.runner
    ids = PROMPTS["c"]

    def last_logits(req, start_pos):
        return runner.compute_logits(Batch([ScheduledSeq(req, start_pos, len(ids) - start_pos)]))[0]

    whole = last_logits(EngineRequest("x", "w", ids, SamplingParams(max_tokens=1)), 0)
    req = EngineRequest("y", "w", ids, SamplingParams(max_tokens=1))
    torch.testing.assert_close(last_logits(req, 10), whole)  # no cache at all: [0, 10) run first
    torch.testing.assert_close(last_logits(req, 0), whole)  # a cache longer than start_pos: rebuilt
    torch.testing.assert_close(last_logits(req, 4), whole)  # ... from 0 again


def test_request_caches_are_freed(tiny):
    runner = tiny.runner
    reqs = run_scheduled(tiny, {"a": 0, "b": 0})
    gone = EngineRequest("z", "w", [5, 6, 7], SamplingParams(max_tokens=1))
    runner.compute_logits(Batch([ScheduledSeq(gone, 0, 3)]))
    # The finished requests are still referenced here: the next step dropped their caches.
    assert runner.num_request_caches == 1
    del gone, reqs
    gc.collect()
    assert runner.num_request_caches == 0


def test_runner_limits(tiny):
    runner = tiny.runner
    assert runner.vocab_size == 128 and runner.max_model_len == 256
    assert runner.kv_cache.num_blocks == 64
    # blocks x (K, V) x layers x tokens x (heads x head_dim) x fp32 bytes: nothing allocated up front
    assert runner.kv_cache.num_bytes == 64 * 2 * 2 * BLOCK_SIZE * 64 * 4


# ---- choosing the runner ----------------------------------------------------------------------


def test_auto_takes_the_paged_transformers_route_for_other_architectures(tiny, model_dir, caplog):
    tiny_dir = tiny.model_dir
    with caplog.at_level(logging.INFO, logger="rill.engine"):
        assert choose_runner("auto", load_config(tiny_dir)) is PagedTransformersRunner
    [record] = [r for r in caplog.records if r.name == "rill.engine"]
    model_type = load_config(tiny_dir).model_type
    assert record.levelno == logging.INFO and repr(model_type) in record.getMessage()
    assert "over the paged KV cache (no native implementation" in record.getMessage()
    assert choose_runner("auto", load_config(model_dir)) is ModelRunner
    assert choose_runner("native", load_config(model_dir)) is ModelRunner
    assert choose_runner("transformers", load_config(model_dir)) is PagedTransformersRunner


def test_a_model_the_paged_route_cannot_run_goes_one_sequence_at_a_time(tiny, caplog):
    """Layers of a kind with no paged form (here a linear attention's): the one-sequence runner, with
    a warning that says why."""
    config = load_config(tiny.model_dir)
    config.layer_types = ["full_attention", "linear_attention"]
    with caplog.at_level(logging.INFO, logger="rill.engine"):
        assert choose_runner("transformers", config) is TransformersRunner
    [record] = [r for r in caplog.records if r.name == "rill.engine"]
    assert record.levelno == logging.WARNING and "'linear_attention' layers have no paged form" in record.getMessage()
    assert "correct but slower" in record.getMessage()


def test_native_on_an_unsupported_architecture_fails(tiny):
    tiny_dir = tiny.model_dir
    config = load_config(tiny_dir)
    unsupported = f"--model-impl native: model_type {config.model_type!r} is not supported"
    with pytest.raises(ValueError, match=unsupported):
        choose_runner("native", config)
    with pytest.raises(ValueError, match="model_impl 'vllm'"):
        choose_runner("vllm", config)


# ---- end to end -------------------------------------------------------------------------------


def test_served_with_model_impl_transformers_matches_native(tmp_path_factory):
    """float32 on both sides: in bfloat16 the two implementations round differently and greedy
    outputs part after a few tokens (--dtype auto picks bfloat16 on a CPU with native bf16)."""
    from openai import OpenAI

    prompt = "The lighthouse keeper wrote in his log that"
    messages = [{"role": "user", "content": "Write a haiku about the sea."}]
    # Both started at once (their starts overlap); the native one is asked, and stopped, first.
    native, srv = start_servers(tmp_path_factory, ("--dtype", "float32", "--max-model-len", "2048"),
                                ("--model-impl", "transformers", "--max-model-len", "2048", "--dtype", "float32",
                                 "--log-level", "info"))
    try:
        client = OpenAI(base_url=f"{native.base_url}/v1", api_key="unused", _strict_response_validation=True,
                        max_retries=0, timeout=120)
        native_text = client.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=24,
                                                temperature=0).choices[0].text
        native_chat = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                                     max_tokens=24, temperature=0).choices[0].message.content
    except BaseException:
        srv.stop()
        raise
    finally:
        stop_server(native)
    try:
        fallback = OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", _strict_response_validation=True,
                          max_retries=0, timeout=120)
        resp = fallback.completions.create(model="smollm2-135m-instruct", prompt=prompt, max_tokens=24,
                                           temperature=0)
        chunks = list(fallback.chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                                       max_tokens=24, temperature=0, stream=True))
        log_text = srv.log()
    finally:
        stop_server(srv)
    assert "transformers' model over the paged KV cache (--model-impl transformers)" in log_text
    assert "transformers runner on cpu" in log_text
    assert resp.choices[0].text == native_text and resp.usage.completion_tokens == 24
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == native_chat
