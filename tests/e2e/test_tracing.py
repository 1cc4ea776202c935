"""End to end: `rill serve --otlp-traces-endpoint` exports a span per request to an OTLP/HTTP receiver run here
(a tiny HTTP server decoding the protobuf with opentelemetry-proto's classes), in the caller's trace, with the
usage the response reported; with the collector down the server still answers, and exports again once it is back."""
from __future__ import annotations

import http.server
import secrets
import threading
import time

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from tests.helpers.server import TINY_MODEL, start_server, stop_server


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind)


def _attrs(key_values) -> dict:
    return {kv.key: _value(kv.value) for kv in key_values}


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every span posted to /v1/traces, with its resource's attributes."""

    def __init__(self, port: int = 0):
        self.spans: list[tuple[dict, Span]] = []
        self.posts = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.posts += 1
                    for resource_spans in request.resource_spans:
                        resource = _attrs(resource_spans.resource.attributes)
                        receiver.spans += [(resource, s) for scope in resource_spans.scope_spans for s in scope.spans]
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def span_of(self, trace_id: str, timeout_s: float = 30.0) -> tuple[dict, Span]:
        """The one span of the trace `trace_id`, once it arrived."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                found = [(r, s) for r, s in self.spans if s.trace_id.hex() == trace_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no span of trace {trace_id} in {timeout_s} s ({len(self.spans)} spans)")


@pytest.fixture(scope="module")
def receiver():
    recv = Receiver()
    yield recv
    recv.stop()


@pytest.fixture(scope="module")
def traced(tmp_path_factory, receiver):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    # Spans leave within 0.1 s (the SDK's default is 5 s); an export gives up after 2 s (default 10 s).
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "2"}
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--max-model-len", "512", "--workers", "2",
                       "--otlp-traces-endpoint", receiver.url, env=env)
    yield srv
    stop_server(srv)


def caller() -> tuple[str, str, dict]:
    """A caller's trace id, its span id, and the headers that carry them."""
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent_id, {"traceparent": f"00-{trace_id}-{parent_id}-01", "tracestate": "caller=1"}


def test_a_chat_request_is_a_span_in_the_callers_trace_with_its_usage(traced, receiver):
    trace_id, parent_id, headers = caller()
    r = httpx.post(f"{traced.base_url}/v1/chat/completions", headers=headers, timeout=60, json={
        "model": TINY_MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6,
        "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    resource, span = receiver.span_of(trace_id)
    assert span.parent_span_id.hex() == parent_id and span.trace_state == "caller=1"
    assert span.name == "llm_request" and span.kind == Span.SPAN_KIND_SERVER
    assert resource["service.name"] == "rill" and resource["process.pid"] > 0
    attrs = _attrs(span.attributes)
    assert attrs["gen_ai.request.id"] == r.headers["x-request-id"]
    assert attrs["gen_ai.response.model"] == TINY_MODEL
    assert attrs["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"] > 0
    assert attrs["gen_ai.usage.completion_tokens"] == usage["completion_tokens"] == 6
    assert (attrs["gen_ai.request.max_tokens"], attrs["gen_ai.request.n"]) == (6, 1)
    assert attrs["gen_ai.request.temperature"] == 0.0
    for name in ("time_in_queue", "time_in_model_prefill", "time_in_model_decode"):
        assert 0 <= attrs[f"gen_ai.latency.{name}"] <= attrs["gen_ai.latency.e2e"], name
    assert 0 < attrs["gen_ai.latency.time_to_first_token"] <= attrs["gen_ai.latency.e2e"]
    assert attrs["gen_ai.latency.e2e"] == pytest.approx((span.end_time_unix_nano - span.start_time_unix_nano) / 1e9,
                                                        abs=0.01)
    assert span.status.code == Status.STATUS_CODE_UNSET


def test_streamed_completions_with_n_and_messages_get_their_spans(traced, receiver):
    trace_id, _, headers = caller()
    with httpx.stream("POST", f"{traced.base_url}/v1/completions", headers=headers, timeout=60, json={
            "model": TINY_MODEL, "prompt": [5, 6, 7, 8], "max_tokens": 3, "n": 2, "ignore_eos": True,
            "stream": True}) as r:
        assert r.status_code == 200 and r.read().endswith(b"data: [DONE]\n\n")
    attrs = _attrs(receiver.span_of(trace_id)[1].attributes)
    assert (attrs["gen_ai.usage.prompt_tokens"], attrs["gen_ai.usage.completion_tokens"]) == (4, 6)
    assert attrs["gen_ai.request.n"] == 2 and attrs["url.path"] == "/v1/completions"

    trace_id, _, headers = caller()
    r = httpx.post(f"{traced.base_url}/v1/messages", headers=headers, timeout=60, json={
        "model": TINY_MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    attrs = _attrs(receiver.span_of(trace_id)[1].attributes)
    usage = r.json()["usage"]  # Anthropic's input_tokens leave out the tokens read from the prefix cache
    assert attrs["gen_ai.usage.prompt_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]
    assert attrs["rill.usage.cached_tokens"] == usage["cache_read_input_tokens"]
    assert attrs["gen_ai.usage.completion_tokens"] == usage["output_tokens"]


def test_a_failed_request_is_an_error_span_with_its_code(traced, receiver):
    trace_id, parent_id, headers = caller()
    r = httpx.post(f"{traced.base_url}/v1/chat/completions", headers=headers, timeout=60, json={
        "model": TINY_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1})
    assert r.status_code == 400
    span = receiver.span_of(trace_id)[1]
    assert span.parent_span_id.hex() == parent_id
    assert span.status.code == Status.STATUS_CODE_ERROR
    code = r.json()["error"]["code"] or r.json()["error"]["type"]
    assert span.status.message == code and _attrs(span.attributes)["error.type"] == code
    assert _attrs(span.attributes)["http.response.status_code"] == 400


def exported_and_failed(log: str) -> bool:
    return "Transient error" in log or "Failed to export" in log


def test_with_the_collector_down_requests_are_answered_and_export_resumes(traced, receiver):
    port = receiver.port
    receiver.stop()
    try:
        for _ in range(3):
            r = httpx.post(f"{traced.base_url}/v1/completions", timeout=60, headers=caller()[2], json={
                "model": TINY_MODEL, "prompt": [5, 6, 7], "max_tokens": 2})
            assert r.status_code == 200, r.text
        # The spans leave on the batch processor's schedule (5 s): keep the collector down until an export failed,
        # or it may come back before any export was tried (a quiet machine answered the three requests in 0.1 s).
        deadline = time.monotonic() + 60
        while not exported_and_failed(traced.log()) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        back = Receiver(port)
    try:
        trace_id, _, headers = caller()
        r = httpx.post(f"{traced.base_url}/v1/completions", headers=headers, timeout=60, json={
            "model": TINY_MODEL, "prompt": [5, 6, 7], "max_tokens": 2})
        assert r.status_code == 200
        back.span_of(trace_id)
    finally:
        back.stop()
    log = traced.log()
    assert exported_and_failed(log)  # logged, not raised
    assert "unhandled error" not in log
