"""`bench serve`: drive any OpenAI-compatible server with streaming requests and measure latency.

The Python API (`BenchConfig`, `build_prompts`, `run_benchmark`, `print_result`,
`add_serve_args`, `config_from_args`) is what `bench compare` and `bench sweep` build on.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import math
import os
import sys
from datetime import datetime

import numpy as np
from tqdm import tqdm

from rill.bench.serving import client
from rill.bench.serving.client import RequestState
from rill.bench.serving.config import BenchConfig, add_serve_args, config_from_args
from rill.bench.serving.datasets import (
    SampleRequest,
    count_tokens,
    default_tokenizer_path,
    load_tokenizer,
    sample_conversations,
    sample_random,
)
from rill.bench.serving.load import arrival_offsets_s, run_load
from rill.bench.serving.metrics import calculate_metrics
from rill.bench.serving.report import print_result, save_result

log = logging.getLogger("rill.bench")
__all__ = ["BenchConfig", "BenchError", "add_serve_args", "build_prompts", "config_from_args", "main",
           "print_result", "run_benchmark", "save_result"]


class BenchError(RuntimeError):
    """The benchmark could not run (unreachable server, every warm-up request failed, ...)."""


def build_prompts(cfg: BenchConfig) -> list[SampleRequest]:
    """The workload, built once: pass it to run_benchmark to send identical prompts to several servers."""
    tokenizer = load_tokenizer(cfg.tokenizer)
    if cfg.dataset_name == "random":
        return sample_random(tokenizer, cfg.num_prompts, cfg.random_input_len, cfg.random_output_len,
                             cfg.random_range_ratio, cfg.random_prefix_len, cfg.seed)
    if cfg.dataset_name == "conversations":
        return sample_conversations(tokenizer, cfg.num_prompts, cfg.conversations_output_len,
                                    cfg.dataset_path, cfg.seed)
    raise ValueError(f"unknown dataset_name {cfg.dataset_name!r} (random or conversations)")


def _warmup_prompts(cfg: BenchConfig) -> list[SampleRequest]:
    # Another seed: warming up with the measured prompts would hand them a prefix-cache hit.
    return build_prompts(dataclasses.replace(cfg, num_prompts=cfg.num_warmups, seed=cfg.seed + 7919))


async def _resolve_model(cfg: BenchConfig, session, headers: dict[str, str],
                         prompts: list[SampleRequest]) -> str:
    try:
        models = await client.fetch_models(session, cfg.base_url, headers)
    except Exception as exc:  # the server may not list models; a given --model can still work
        if cfg.model:
            return cfg.model
        raise BenchError(f"cannot list models at {cfg.base_url} ({exc}); pass --model") from None
    if not cfg.model and not models:
        raise BenchError(f"{cfg.base_url}/v1/models lists no model; pass --model")
    model = cfg.model or models[0]["id"]
    entry = next((m for m in models if m.get("id") == model), {})
    max_model_len = entry.get("max_model_len")
    longest = max(p.prompt_len + p.expected_output_len for p in prompts)
    if isinstance(max_model_len, int) and longest > max_model_len:
        raise BenchError(f"the longest request needs {longest} tokens (prompt + output) but {model} "
                         f"serves max_model_len {max_model_len}: lower --random-input-len/--random-output-len")
    return model


def _fill_output_lens(outputs: list[client.RequestOutput], tokenizer_path: str | None) -> str | None:
    """Count tokens where the server sent no usage; returns "usage", "counted", "mixed" or None."""
    done = [o for o in outputs if o.success]
    missing = [o for o in done if o.output_len_source != "usage"]
    if missing:
        tokenizer = load_tokenizer(tokenizer_path)
        for o in missing:
            o.output_len = count_tokens(tokenizer, o.generated_text)
            o.output_len_source = "counted"
    sources = {o.output_len_source for o in done}
    return sources.pop() if len(sources) == 1 else ("mixed" if sources else None)


async def run_benchmark(cfg: BenchConfig, prompts: list[SampleRequest] | None = None) -> dict:
    """Run one benchmark; returns the result dict (vLLM's field names), the one saved as JSON."""
    if prompts is None:
        prompts = await asyncio.to_thread(build_prompts, cfg)
    if not prompts:
        raise BenchError("no prompts to send")
    warmups = await asyncio.to_thread(_warmup_prompts, cfg) if cfg.num_warmups > 0 else []
    base_url = cfg.base_url.rstrip("/")
    url = base_url + cfg.endpoint
    headers = client.auth_headers(cfg.api_key or os.environ.get("OPENAI_API_KEY"), cfg.headers)
    async with client.open_session(cfg.max_concurrency, cfg.request_timeout_s) as session:
        model = await _resolve_model(cfg, session, headers, prompts + warmups)

        def bodies(requests: list[SampleRequest]) -> list[bytes]:
            return [client.request_body(cfg.endpoint, model, r.prompt, r.expected_output_len,
                                        ignore_eos=cfg.ignore_eos, temperature=cfg.temperature,
                                        extra_body=cfg.extra_body) for r in requests]

        if warmups:
            log.info("Warming up with %d requests...", len(warmups))
            warm, _ = await run_load(session, url, headers, bodies(warmups), [w.prompt_len for w in warmups],
                                     [0.0] * len(warmups), max_concurrency=cfg.max_concurrency,
                                     require_done=cfg.require_done)
            if not any(o.success for o in warm):
                raise BenchError(f"every warm-up request to {url} failed: {warm[0].error}")
        offsets_s = arrival_offsets_s(len(prompts), cfg.request_rate, cfg.burstiness,
                                      np.random.default_rng(cfg.seed))
        request_bodies = bodies(prompts)  # encoded before the clock starts
        distribution = "Poisson process" if cfg.burstiness == 1.0 else "Gamma distribution"
        log.info("Traffic request rate: %s\nBurstiness factor: %s (%s)\nMaximum request concurrency: %s",
                 cfg.request_rate, cfg.burstiness, distribution, cfg.max_concurrency)
        with tqdm(total=len(prompts), disable=cfg.disable_tqdm, file=sys.stderr) as pbar:
            outputs, duration_s = await run_load(
                session, url, headers, request_bodies, [p.prompt_len for p in prompts], offsets_s,
                max_concurrency=cfg.max_concurrency, max_duration_s=cfg.max_duration_s,
                drain_timeout_s=cfg.drain_timeout_s, on_done=lambda _: pbar.update(1),
                require_done=cfg.require_done)
    source = await asyncio.to_thread(_fill_output_lens, outputs, cfg.tokenizer)
    return _result(cfg, model, prompts, outputs, duration_s, source)


def _result(cfg: BenchConfig, model: str, prompts: list[SampleRequest], outputs: list[client.RequestOutput],
            duration_s: float, output_token_source: str | None) -> dict:
    chat = client.is_chat(cfg.endpoint)
    backend = "openai-chat" if chat else "openai"  # vLLM's backend names for these endpoints
    done = [o.success for o in outputs]
    server_input_lens = [o.server_prompt_len for o in outputs if o.success]
    return {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": cfg.label,
        "model_id": model,
        "tokenizer_id": cfg.tokenizer or str(default_tokenizer_path()),
        "num_prompts": len(prompts),
        **cfg.metadata,
        "request_rate": cfg.request_rate if cfg.request_rate < math.inf else "inf",
        "burstiness": cfg.burstiness if cfg.burstiness < math.inf else "inf",
        "max_concurrency": cfg.max_concurrency,
        **calculate_metrics(outputs, duration_s, cfg.metric_percentiles, cfg.goodput),
        # Per request, in workload order; zeros for requests that did not complete.
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": [o.output_len if ok else 0 for o, ok in zip(outputs, done)],
        "ttfts": [o.ttft_s if ok else 0.0 for o, ok in zip(outputs, done)],
        "itls": [o.itl_s if ok else [] for o, ok in zip(outputs, done)],
        "errors": [o.error for o in outputs],
        # Ours (vLLM has no such fields).
        "base_url": cfg.base_url,
        "endpoint": cfg.endpoint,
        "dataset_name": cfg.dataset_name,
        "input_len_unit": "chat message content tokens (chat template excluded)" if chat
                          else "prompt tokens (no special tokens)",
        "output_token_source": output_token_source,
        "server_total_input_tokens": (sum(server_input_lens) if server_input_lens
                                      and None not in server_input_lens else None),
        "ignore_eos": cfg.ignore_eos,
        "seed": cfg.seed,
        "num_warmups": cfg.num_warmups,
        "max_duration_s": cfg.max_duration_s,
        "num_not_sent": sum(o.state is RequestState.NOT_SENT for o in outputs),
        "num_cancelled": sum(o.state is RequestState.CANCELLED for o in outputs),
        "percentile_metrics": list(cfg.percentile_metrics),
        "metric_percentiles": list(cfg.metric_percentiles),
        "goodput_slos_ms": dict(cfg.goodput) or None,
    }


def main(args: argparse.Namespace) -> int:
    """`python -m rill.bench serve` / `rill bench serve`: run, print the table, maybe save the JSON."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        cfg = config_from_args(args)
        result = asyncio.run(run_benchmark(cfg))
    except (BenchError, ValueError, OSError) as exc:
        print(f"bench serve: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench serve: interrupted", file=sys.stderr)
        return 130
    print_result(result)
    if cfg.save_result:
        print(f"Saved the result to {save_result(result, cfg.result_dir, cfg.result_filename)}")
    return 0 if result["completed"] else 1

