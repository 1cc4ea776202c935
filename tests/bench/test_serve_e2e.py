"""`python -m rill.bench serve` end to end against a real `rill serve`: the JSON has every field, sanely."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from rill.bench.serving.serve import BenchConfig, build_prompts, run_benchmark
from rill.bench.serving.servers import ROOT
from rill.bench.serving.tiny_model import write_tiny_model
from tests.helpers.server import start_server, stop_server

pytestmark = pytest.mark.e2e

NUM_PROMPTS = 8
INPUT_LEN = 32
OUTPUT_LEN = 32
PERCENTILES = ["p90", "p99"]
METRICS = ["ttft", "tpot", "itl", "e2el"]
VLLM_FIELDS = ["date", "backend", "model_id", "tokenizer_id", "num_prompts", "request_rate", "burstiness",
               "max_concurrency", "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
               "request_throughput", "request_goodput", "output_throughput", "total_token_throughput",
               "input_lens", "output_lens", "ttfts", "itls", "errors"]


@pytest.fixture(scope="module")
def bench_server(model_dir, tmp_path_factory):
    """A dummy-model Rill: the tiny random-weight model with the bundled tokenizer."""
    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--max-model-len", "1024")
    yield srv
    stop_server(srv)


def test_cli_run_saves_a_complete_vllm_style_result(bench_server, tmp_path):
    cmd = [sys.executable, "-m", "rill.bench", "serve", "--base-url", bench_server.base_url,
           "--num-prompts", str(NUM_PROMPTS), "--random-input-len", str(INPUT_LEN),
           "--random-output-len", str(OUTPUT_LEN), "--max-concurrency", "4", "--goodput", "ttft:60000",
           "--disable-tqdm", "--save-result", "--result-dir", str(tmp_path), "--result-filename", "run.json",
           "--metadata", "purpose=e2e"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Serving Benchmark Result" in proc.stdout and "Mean TTFT (ms):" in proc.stdout
    result = json.loads((tmp_path / "run.json").read_text())

    for field in VLLM_FIELDS + [f"{stat}_{m}_ms" for m in METRICS for stat in ["mean", "median", "std"] + PERCENTILES]:
        assert field in result, field
    assert result["backend"] == "openai" and result["purpose"] == "e2e"
    assert result["completed"] == result["num_prompts"] == NUM_PROMPTS
    assert result["failed"] == 0 and result["errors"] == [""] * NUM_PROMPTS
    assert result["output_token_source"] == "usage"
    assert result["total_output_tokens"] == OUTPUT_LEN * NUM_PROMPTS  # ignore_eos forced every length
    assert result["output_lens"] == [OUTPUT_LEN] * NUM_PROMPTS
    assert result["total_input_tokens"] == result["server_total_input_tokens"] == INPUT_LEN * NUM_PROMPTS
    assert result["max_concurrency"] == 4 and result["request_rate"] == "inf"
    # <=: chunks read from one TCP segment share a timestamp, so a request may end at its first token time.
    assert 0 < result["mean_ttft_ms"] <= result["mean_e2el_ms"]
    assert 0 < result["p99_ttft_ms"] <= result["p99_e2el_ms"]
    assert result["median_ttft_ms"] <= result["p90_ttft_ms"] <= result["p99_ttft_ms"]
    # A starved client (a loaded CI machine) may read a whole stream at once: every gap 0, so the figures
    # are checked against the per-token gaps rather than for being positive.
    # A request whose whole stream came in one read has no gaps at all, so only the total must be non-empty.
    assert all(len(itl) <= OUTPUT_LEN - 1 for itl in result["itls"])
    gaps_ms = [gap * 1000 for itl in result["itls"] for gap in itl]
    assert gaps_ms, "every stream arrived in a single read"
    assert result["mean_itl_ms"] == pytest.approx(sum(gaps_ms) / len(gaps_ms)) and min(gaps_ms) >= 0
    streamed_ms = sum(gaps_ms) / NUM_PROMPTS  # first token to last, on average; the end comes after
    assert result["mean_tpot_ms"] * (OUTPUT_LEN - 1) >= streamed_ms - 1e-6
    assert result["duration"] * 1000 >= max(result["ttfts"]) * 1000 > 0
    expected_rate = NUM_PROMPTS / result["duration"]
    assert result["request_throughput"] == pytest.approx(expected_rate)
    assert result["request_goodput"] == pytest.approx(expected_rate)  # a 60 s TTFT SLO: every request is good
    assert result["output_throughput"] == pytest.approx(OUTPUT_LEN * expected_rate)


def test_api_chat_run_with_shared_prompts(bench_server):
    cfg = BenchConfig(base_url=bench_server.base_url, endpoint="/v1/chat/completions", num_prompts=3,
                      random_input_len=16, random_output_len=4, max_concurrency=3, num_warmups=0, disable_tqdm=True)
    prompts = build_prompts(cfg)
    result = asyncio.run(run_benchmark(cfg, prompts))
    assert result["backend"] == "openai-chat"
    assert (result["completed"], result["failed"]) == (3, 0)
    assert result["total_output_tokens"] == 12 and result["output_token_source"] == "usage"
    assert result["input_lens"] == [16, 16, 16]  # content tokens; the server adds its template
    assert result["server_total_input_tokens"] > result["total_input_tokens"]
    # Equal when a request's 4 tokens arrive in one chunk: the tiny model steps faster than the
    # client reads, and the worker's mailbox merges what the client has not read yet.
    assert 0 < result["mean_ttft_ms"] <= result["mean_e2el_ms"]
