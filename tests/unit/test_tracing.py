"""The span built for a finished request (asgi/http/tracing.py) through the SDK's in-memory exporter: vLLM's
attributes, the caller's traceparent as parent, error status; the export's rate-limited logs; nothing of
OpenTelemetry imported without --otlp-traces-endpoint."""
from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from rill.asgi.http.request_context import RequestContext
from rill.asgi.http.trace_export import OncePerInterval, service_resource
from rill.asgi.http.tracing import RequestTracer
from rill.ipc.protocol import RequestTimings, SamplingParams

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01".encode()


@pytest.fixture
def traced():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield RequestTracer(provider.get_tracer("test")), exporter
    provider.shutdown()


def context(method="POST", path="/v1/chat/completions", headers=()) -> RequestContext:
    scope = {"method": method, "path": path, "headers": [(b"x-request-id", b"req-1"), *headers]}
    return RequestContext.from_scope(scope)


def finished_chat(headers=()) -> RequestContext:
    """What a chat request of n=2 leaves in its context once its answer went out."""
    ctx = context(headers=headers)
    ctx.start_s = time.perf_counter() - 0.5
    ctx.status, ctx.model = 200, "tiny"
    ctx.params, ctx.n = SamplingParams(max_tokens=16, temperature=0.0, top_p=0.9), 2
    ctx.token(1, 0)
    ctx.first_token_s = ctx.start_s + 0.1
    ctx.prompt_tokens, ctx.output_tokens, ctx.cached_tokens = 31, 20, 16
    ctx.engine_timings = [RequestTimings(0.01, 0.05, 0.3), RequestTimings(0.02, 0.04, 0.25)]
    ctx.finish_reason = "length"
    ctx.end_s = ctx.start_s + 0.5
    return ctx


def test_span_has_vllms_attributes_and_the_callers_parent(traced):
    tracer, exporter = traced
    tracer.observe(finished_chat([(b"traceparent", TRACEPARENT), (b"tracestate", b"vendor=abc")]))
    (span,) = exporter.get_finished_spans()
    assert span.name == "llm_request" and span.kind is SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID and span.parent.is_remote
    assert span.context.trace_state.get("vendor") == "abc"
    attrs = dict(span.attributes)
    assert attrs["gen_ai.request.id"] == "req-1"
    assert attrs["gen_ai.response.model"] == "tiny"
    assert (attrs["gen_ai.request.max_tokens"], attrs["gen_ai.request.temperature"], attrs["gen_ai.request.top_p"],
            attrs["gen_ai.request.n"]) == (16, 0.0, 0.9, 2)
    assert (attrs["gen_ai.usage.prompt_tokens"], attrs["gen_ai.usage.completion_tokens"]) == (31, 20)
    assert attrs["rill.usage.cached_tokens"] == 16
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    # the slowest choice's engine figures
    assert attrs["gen_ai.latency.time_in_queue"] == 0.02
    assert attrs["gen_ai.latency.time_in_model_prefill"] == 0.05
    assert attrs["gen_ai.latency.time_in_model_decode"] == 0.3
    assert attrs["gen_ai.latency.time_in_model_inference"] == pytest.approx(0.35)
    assert attrs["gen_ai.latency.time_to_first_token"] == pytest.approx(0.1)
    assert attrs["gen_ai.latency.e2e"] == pytest.approx(0.5)
    assert attrs["http.response.status_code"] == 200 and attrs["url.path"] == "/v1/chat/completions"
    assert span.status.status_code is StatusCode.UNSET
    # start at arrival, end when the response ended: the span lasts the request's duration
    assert (span.end_time - span.start_time) / 1e9 == pytest.approx(0.5, abs=1e-3)
    assert abs(span.end_time - time.time_ns()) < 5e9


def test_without_traceparent_or_with_a_malformed_one_the_span_starts_a_trace(traced):
    tracer, exporter = traced
    tracer.observe(finished_chat())
    tracer.observe(finished_chat([(b"traceparent", b"00-zz-00f067aa0ba902b7-01")]))
    spans = exporter.get_finished_spans()
    assert len(spans) == 2 and all(s.parent is None for s in spans)
    assert spans[0].context.trace_id != spans[1].context.trace_id


def test_a_failed_request_is_an_error_span_with_its_code(traced):
    tracer, exporter = traced
    ctx = context(headers=[(b"traceparent", TRACEPARENT)])
    ctx.status, ctx.error_code, ctx.end_s = 400, "invalid_value", time.perf_counter()
    tracer.observe(ctx)
    ctx = context()
    ctx.status, ctx.end_s = 500, time.perf_counter()  # an unhandled error: no code, the status says it
    tracer.observe(ctx)
    bad, crashed = exporter.get_finished_spans()
    assert bad.status.status_code is StatusCode.ERROR and bad.status.description == "invalid_value"
    assert bad.attributes["error.type"] == "invalid_value"
    assert format(bad.parent.span_id, "016x") == PARENT_ID
    assert "gen_ai.usage.prompt_tokens" not in bad.attributes  # never reached the engine
    assert crashed.status.status_code is StatusCode.ERROR and crashed.attributes["error.type"] == "500"


def test_a_stream_the_engine_failed_after_its_200_is_an_error_span(traced):
    tracer, exporter = traced
    ctx = finished_chat()
    ctx.finish_reason = "timeout"
    tracer.observe(ctx)
    ctx = finished_chat()
    ctx.finish_reason = "abort"  # the client left: not the server's failure
    tracer.observe(ctx)
    timed_out, left = exporter.get_finished_spans()
    assert timed_out.status.status_code is StatusCode.ERROR and timed_out.attributes["error.type"] == "request_timeout"
    assert left.status.status_code is StatusCode.UNSET


def test_embeddings_carry_usage_but_not_rills_own_sampling_settings(traced):
    tracer, exporter = traced
    ctx = finished_chat()
    ctx.path, ctx.params = "/v1/embeddings", SamplingParams(max_tokens=1, temperature=0.0, embed=True)
    tracer.observe(ctx)
    (span,) = exporter.get_finished_spans()
    assert span.attributes["gen_ai.usage.prompt_tokens"] == 31
    assert "gen_ai.request.max_tokens" not in span.attributes


def test_probes_and_listings_get_no_span(traced):
    tracer, exporter = traced
    for path in ("/health", "/metrics", "/v1/models"):
        ctx = context("GET", path, [(b"traceparent", TRACEPARENT)])
        ctx.status, ctx.end_s = 200, time.perf_counter()
        tracer.observe(ctx)
    assert exporter.get_finished_spans() == ()


def test_service_name_is_rill_unless_the_environment_names_one(monkeypatch):
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert service_resource().attributes["service.name"] == "rill"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-llm")
    assert service_resource().attributes["service.name"] == "gateway-llm"


def test_export_failures_are_logged_once_a_minute_with_a_count(caplog):
    logger = logging.getLogger("opentelemetry.test_export")
    limiter = OncePerInterval(interval_s=60.0)
    logger.addFilter(limiter)
    try:
        with caplog.at_level(logging.ERROR, logger="opentelemetry.test_export"):
            for _ in range(5):
                logger.error("Failed to export %s batch", "span")
            limiter._last[("opentelemetry.test_export", "Failed to export %s batch")] = (time.monotonic() - 61, 4)
            logger.error("Failed to export %s batch", "span")
    finally:
        logger.removeFilter(limiter)
    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "Failed to export span batch"
    assert len(messages) == 2 and "(4 more like it in the last 61 s)" in messages[1]


def test_without_the_flag_the_worker_imports_nothing_of_opentelemetry():
    code = ("import sys, rill.asgi.app, rill.asgi.state, rill.launcher\n"
            "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
