"""The OpenTelemetry span of one finished request (--otlp-traces-endpoint), built from its RequestContext.

Imported only when the flag is given (asgi/state.py): a server without it loads nothing of OpenTelemetry.
`RequestTracer.observe` is a WorkerState observer, like the access log: it runs once the response has ended,
so the span costs the request nothing while it runs. As vLLM (vllm/v1/engine/output_processor.py `do_tracing`),
one SERVER span named `llm_request` per request, starting at its arrival, with vLLM's attribute names
(vllm/tracing.py `SpanAttributes`), its parent the caller's W3C `traceparent` (and `tracestate`).
"""
from __future__ import annotations

import time

from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from rill.asgi.http.request_context import RequestContext

SPAN_NAME = "llm_request"  # vLLM's
TRACE_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate"}
# Only POST requests get a span: every route that does work (the generating routes, embeddings, rerank, tokenize,
# files and batches), failed ones included; probes, scrapes and listings (GET) would drown them.
TRACED_METHODS = frozenset({"POST"})
# Failures that happened after a 200 went out: how the request ended, as its error code (a stream's error event).
_STREAM_FAILURES = {"error": "engine_error", "timeout": "request_timeout"}
_PROPAGATOR = TraceContextTextMapPropagator()


class SpanAttributes:
    """vLLM's names (vllm/tracing.py), then OpenTelemetry's HTTP and error conventions, then Rill's own."""

    GEN_AI_REQUEST_ID = "gen_ai.request.id"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
    GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
    GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
    GEN_AI_REQUEST_N = "gen_ai.request.n"
    GEN_AI_USAGE_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
    GEN_AI_USAGE_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
    GEN_AI_LATENCY_TIME_IN_QUEUE = "gen_ai.latency.time_in_queue"
    GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN = "gen_ai.latency.time_to_first_token"
    GEN_AI_LATENCY_E2E = "gen_ai.latency.e2e"
    GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL = "gen_ai.latency.time_in_model_prefill"
    GEN_AI_LATENCY_TIME_IN_MODEL_DECODE = "gen_ai.latency.time_in_model_decode"
    GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE = "gen_ai.latency.time_in_model_inference"
    GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
    HTTP_REQUEST_METHOD = "http.request.method"
    URL_PATH = "url.path"
    HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
    ERROR_TYPE = "error.type"
    RILL_USAGE_CACHED_TOKENS = "rill.usage.cached_tokens"


A = SpanAttributes


def caller_context(headers):
    """The caller's trace context from the request's `traceparent` and `tracestate` headers (None: a new trace;
    a malformed traceparent is ignored, as the W3C spec asks)."""
    carrier = {TRACE_HEADERS[name]: value.decode("latin-1") for name, value in headers if name in TRACE_HEADERS}
    return _PROPAGATOR.extract(carrier) if carrier else None


def span_attributes(ctx: RequestContext) -> dict:
    """What the span says of the request; engine figures only for a request that reached the engine."""
    attrs = {A.GEN_AI_REQUEST_ID: ctx.request_id, A.HTTP_REQUEST_METHOD: ctx.method, A.URL_PATH: ctx.path,
             A.GEN_AI_LATENCY_E2E: ctx.duration_s}
    if ctx.status:
        attrs[A.HTTP_RESPONSE_STATUS_CODE] = ctx.status
    if ctx.model is not None:
        attrs[A.GEN_AI_RESPONSE_MODEL] = ctx.model
    params = ctx.params
    # Embeddings and scores run as one-token engine requests: their sampling settings are Rill's, not the caller's.
    if params is not None and not params.embed:
        # vLLM skips a falsy value; here temperature 0 (greedy) is written, as what the caller asked.
        attrs[A.GEN_AI_REQUEST_MAX_TOKENS] = params.max_tokens
        attrs[A.GEN_AI_REQUEST_TEMPERATURE] = params.temperature
        attrs[A.GEN_AI_REQUEST_TOP_P] = params.top_p
        attrs[A.GEN_AI_REQUEST_N] = ctx.n
    if ctx.finish_reason is not None:  # the request ran on the engine
        attrs[A.GEN_AI_USAGE_PROMPT_TOKENS] = ctx.prompt_tokens
        attrs[A.GEN_AI_USAGE_COMPLETION_TOKENS] = ctx.output_tokens
        attrs[A.RILL_USAGE_CACHED_TOKENS] = ctx.cached_tokens
        attrs[A.GEN_AI_RESPONSE_FINISH_REASONS] = (ctx.finish_reason,)
    if ctx.ttft_s is not None:
        attrs[A.GEN_AI_LATENCY_TIME_TO_FIRST_TOKEN] = ctx.ttft_s
    if ctx.engine_timings:
        # One engine request per choice (n, or a prompt list): the slowest choice's figure is the request's.
        queue_s = max(t.queue_s for t in ctx.engine_timings)
        prefill_s = max(t.prefill_s for t in ctx.engine_timings)
        decode_s = max(t.decode_s for t in ctx.engine_timings)
        attrs[A.GEN_AI_LATENCY_TIME_IN_QUEUE] = queue_s
        attrs[A.GEN_AI_LATENCY_TIME_IN_MODEL_PREFILL] = prefill_s
        attrs[A.GEN_AI_LATENCY_TIME_IN_MODEL_DECODE] = decode_s
        attrs[A.GEN_AI_LATENCY_TIME_IN_MODEL_INFERENCE] = max(t.prefill_s + t.decode_s for t in ctx.engine_timings)
    return attrs


def failure(ctx: RequestContext) -> str | None:
    """The error code of a failed request (a 4xx or 5xx, or a stream the engine failed after its 200), else None."""
    if ctx.status >= 400:
        return ctx.error_code or str(ctx.status)
    if ctx.finish_reason in _STREAM_FAILURES:
        return ctx.error_code or _STREAM_FAILURES[ctx.finish_reason]
    return None


class RequestTracer:
    """A WorkerState observer: one span per finished request, handed to the tracer's span processor."""

    def __init__(self, tracer: Tracer):
        self.tracer = tracer

    def observe(self, ctx: RequestContext) -> None:
        if ctx.method not in TRACED_METHODS:
            return
        # The context's times are perf_counter's; a span's are wall-clock nanoseconds.
        now_ns, now_s = time.time_ns(), time.perf_counter()
        end_s = ctx.end_s if ctx.end_s is not None else now_s
        span = self.tracer.start_span(SPAN_NAME, context=caller_context(ctx.headers), kind=SpanKind.SERVER,
                                      attributes=span_attributes(ctx),
                                      start_time=now_ns - int((now_s - ctx.start_s) * 1e9))
        if (code := failure(ctx)) is not None:
            span.set_attribute(A.ERROR_TYPE, code)
            span.set_status(Status(StatusCode.ERROR, code))
        span.end(end_time=now_ns - int((now_s - end_s) * 1e9))
