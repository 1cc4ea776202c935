"""The microbenchmarks run and measure the right thing: ipc_bench, engine_step, baseline_app, tiny_model."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import zmq

from rill.bench.ipc import ipc_bench
from rill.bench.ipc.shm_ring import ShmRing, segment_name
from rill.bench.kernels import engine_step
from rill.bench.serving.tiny_model import TINY_SHAPE, write_tiny_model
from rill.engine_proc.sched.request import EngineRequest

ROOT = Path(__file__).resolve().parents[2]
VARIANT_FIELDS = {"msgs_per_s", "us_per_msg", "sender_cpu_us_per_msg", "receiver_cpu_us_per_msg", "cpu_us_per_msg",
                  "ping_rtt_us", "wire_bytes", "ids_identical", "us_per_msg_rounds"}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_ipc_bench_quick_writes_every_field(tmp_path):
    out = tmp_path / "ipc_bench-test.json"
    ipc_bench.main(["--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"benchmark", "command", "date", "machine", "params", "results", "conclusion"} <= report.keys()
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["torch"]
    assert set(report["results"]) == {"prompt_4k", "step_256", "step_256_top20"}
    for result in report["results"].values():
        assert set(result["variants"]) == set(ipc_bench.VARIANTS)
        for fields in result["variants"].values():
            assert VARIANT_FIELDS <= fields.keys()
            assert fields["ids_identical"] is True  # crossed the process boundary intact
            assert fields["msgs_per_s"] > 0 and fields["cpu_us_per_msg"] > 0
        assert set(result["ratios"]) == {f"{v}/zmq_list" for v in ipc_bench.VARIANTS if v != "zmq_list"}
    assert "## Conclusion" in out.with_suffix(".md").read_text()
    assert not list(Path("/dev/shm").glob(f"rill_{os.getpid()}_bench-*"))  # the rings are gone


@pytest.mark.parametrize("payload_name", list(ipc_bench.PAYLOADS))
def test_every_variant_delivers_the_same_ids(payload_name):
    """In one process, message by message: shm, bytes and multipart give what the inline list gives."""
    payload = ipc_bench.PAYLOADS[payload_name]
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    tx.bind("inproc://ids")
    rx.connect("inproc://ids")
    name = segment_name(str(os.getpid()), f"test-bench-{payload_name}")
    producer, consumer = ShmRing(name, 1 << 16, create=True), ShmRing(name, 1 << 16, create=False)
    try:
        for variant in ipc_bench.VARIANTS:
            for i in range(2 * ipc_bench.NUM_VERSIONS):
                ipc_bench.send(tx, producer, variant, payload, i)
                ids, logprobs = ipc_bench.receive(rx, consumer, variant, payload)
                assert isinstance(ids, list) and ids == payload.ids[i % ipc_bench.NUM_VERSIONS].tolist(), variant
                if payload.has_logprobs:
                    expected = payload.logprobs[i % ipc_bench.NUM_VERSIONS]
                    assert isinstance(logprobs, list)
                    np.testing.assert_array_equal(np.array(logprobs, np.float32), expected)
                else:
                    assert logprobs is None
    finally:
        consumer.close()
        producer.close()
        ctx.destroy(linger=0)


def test_engine_step_quick_batch_1(tiny_dir, tmp_path, monkeypatch):
    # The tiny config keeps this fast; the bundled model takes the same path with its weights.
    out = tmp_path / "engine_step.json"
    monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    try:
        report = engine_step.main(["--quick", "--batch-sizes", "1", "--model", str(tiny_dir), "--out", str(out)])
    finally:
        os.environ.pop("THP_MEM_ALLOC_ENABLE", None)  # set by main(); monkeypatch puts back what was there
    # It measures in the engine's environment: huge pages for large tensors, as `rill serve` sets them.
    assert report["params"]["engine_env"] == {"THP_MEM_ALLOC_ENABLE": "1"}
    assert json.loads(out.read_text())["results"] == report["results"]
    assert set(report["results"]) == {"decode batch 1", "prefill 64 tokens"}
    for row in report["results"].values():
        for impl in ("native", "transformers"):
            assert row[impl]["ms_per_step"] > 0 and row[impl]["tokens_per_s"] > 0
        assert row["native/transformers"]["ms_per_step"] > 0 and row["invariant/native"]["ms_per_step"] > 0
    # Compiled decode steps are measured for decode only (rill serve prefills eagerly).
    assert report["results"]["decode batch 1"]["compiled/native"]["ms_per_step"] > 0
    assert "compiled" not in report["results"]["prefill 64 tokens"]
    assert out.with_suffix(".md").is_file()


def test_engine_step_contexts_and_blocks():
    assert engine_step.context_lens(1) == [192]
    assert engine_step.context_lens(8)[0] == 128 and engine_step.context_lens(8)[-1] == 256
    req = EngineRequest("r", "w", [1] * 40, engine_step.GREEDY)
    engine_step.BlockCounter().cover(req, 40)
    assert req.block_ids == [1, 2, 3]  # block 0 is the padding block of decode block tables


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def baseline_url():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "rill.bench.serving.baseline_app", "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None, "the baseline app exited"
        assert time.monotonic() < deadline, "the baseline app did not start"
        time.sleep(0.1)
    yield url
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(20) == 0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise


def _stream(url: str, body: dict) -> tuple[httpx.Response, list[str]]:
    with httpx.stream("POST", url, json=body, timeout=30) as response:
        text = "".join(response.iter_text())
    assert text.endswith("\n\n")
    return response, [event.removeprefix("data: ") for event in text.split("\n\n") if event]


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_baseline_app_streams_rill_sse_shape(baseline_url, route):
    body = {"model": "m", "max_tokens": 7, "stream": True, "stream_options": {"include_usage": True}}
    body |= {"messages": [{"role": "user", "content": "hi"}]} if route.startswith("chat") else {"prompt": "hi"}
    response, events = _stream(f"{baseline_url}/v1/{route}", body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["cache-control"] == "no-cache"
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    if route.startswith("chat"):
        assert chunks.pop(0)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        texts = [c["choices"][0]["delta"]["content"] for c in chunks]
    else:
        texts = [c["choices"][0]["text"] for c in chunks]
    assert len(texts) == 7 and all(texts)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 6 + ["length"]


def test_baseline_app_models_and_plain_body(baseline_url):
    assert httpx.get(f"{baseline_url}/v1/models").json()["data"][0]["object"] == "model"
    body = httpx.post(f"{baseline_url}/v1/completions", json={"prompt": "x", "max_tokens": 3}).json()
    assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["finish_reason"] == "length"


def test_tiny_model_dir_has_config_and_tokenizer(tiny_dir):
    from tokenizers import Tokenizer

    from rill.engine_proc.model.bundled import ensure_bundled_model
    from rill.engine_proc.model.loader import load_config

    config, bundled = load_config(tiny_dir), load_config(ensure_bundled_model())
    assert config.model_type == "llama" and config.vocab_size == bundled.vocab_size
    assert {k: getattr(config, k) for k in TINY_SHAPE} == TINY_SHAPE
    assert config.eos_token_id == bundled.eos_token_id
    assert not list(tiny_dir.glob("*.safetensors"))
    assert Tokenizer.from_file(str(tiny_dir / "tokenizer.json")).encode("Hello").ids
    assert json.loads((tiny_dir / "tokenizer_config.json").read_text()).get("chat_template")


def test_linear_kernels_reads_a_shapes_layers_and_times_each_kernel(tmp_path, monkeypatch):
    from rill.bench.kernels import linear_kernels

    assert linear_kernels.shapes_of(ROOT / "bench/models/qwen2.5-1.5b") == [
        ("qkv_proj", 2048, 1536), ("o_proj", 1536, 1536), ("gate_up_proj", 17920, 1536), ("down_proj", 1536, 8960),
        ("lm_head", 151936, 1536)]
    monkeypatch.setattr(linear_kernels, "SHAPES", [("o_proj", 576, 576)])
    monkeypatch.setattr(linear_kernels, "COPIES", 2)
    report = linear_kernels.main(["--quick", "--out", str(tmp_path / "linear_kernels.json")])
    if report is None:
        pytest.skip("neither AMX-BF16 nor AVX-512 BF16 here")
    kinds = {"amx", "onednn"} | ({"brgemm"} if report["params"]["kernel"] == "avx512_bf16" else set())
    assert [(r["shape"], r["rows"]) for r in report["results"]] == [("o_proj", 1), ("o_proj", 32)]
    assert all(set(r["ms"]) == kinds and min(r["ms"].values()) > 0 for r in report["results"])
