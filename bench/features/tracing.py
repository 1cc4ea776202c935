"""`python -m rill.bench.features.tracing`: what --otlp-traces-endpoint costs an API worker per request.

In one process, interleaved rounds, per finished request: the observers every request already pays (the metrics,
the access line formatted into /dev/null) against the span observer (asgi/http/tracing.py) feeding the SDK's
BatchSpanProcessor, whose thread exports over OTLP/HTTP to a sink in this process, so its encoding and posting
compete for the GIL as they would in a worker. Without the flag no span code runs at all: what is left is the
RequestContext keeping a reference to the request's headers, timed here as a context made with and without it.
"""
from __future__ import annotations

import argparse
import http.server
import logging
import os
import statistics
import threading
import time
from pathlib import Path

from rill.asgi.http.access_log import access_log, log_access
from rill.asgi.http.request_context import RequestContext
from rill.asgi.routes.metrics import Metrics
from rill.bench.serving.provenance import provenance, save_results
from rill.ipc.protocol import RequestTimings, SamplingParams

HEADERS = [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"OpenAI/Python 1.99.0"), (b"accept", b"application/json"),
           (b"content-type", b"application/json"), (b"authorization", b"Bearer sk-unused"),
           (b"content-length", b"187"), (b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
           (b"x-stainless-lang", b"python")]
SCOPE = {"method": "POST", "path": "/v1/chat/completions", "headers": HEADERS}


def finished() -> RequestContext:
    ctx = RequestContext.from_scope(SCOPE)
    ctx.status, ctx.model, ctx.params, ctx.n = 200, "smollm2", SamplingParams(max_tokens=64, temperature=0.7), 1
    for _ in range(64):
        ctx.token()
    ctx.prompt_tokens, ctx.output_tokens, ctx.finish_reason = 31, 64, "length"
    ctx.engine_timings = [RequestTimings(0.001, 0.02, 0.5)]
    ctx.end_s = time.perf_counter()
    return ctx


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def per_call_us(fn, num: int) -> float:
    contexts = [finished() for _ in range(num)]
    started = time.perf_counter()
    for ctx in contexts:
        fn(ctx)
    return (time.perf_counter() - started) / num * 1e6


def context_us(num: int, with_headers: bool) -> float:
    started = time.perf_counter()
    if with_headers:
        for _ in range(num):
            RequestContext("id", "POST", "/v1/chat/completions", headers=HEADERS)
    else:
        for _ in range(num):
            RequestContext("id", "POST", "/v1/chat/completions")
    return (time.perf_counter() - started) / num * 1e6


def flush_us(traces, num: int) -> float:
    """The export thread's work for `num` queued spans (encode, post), done now: what it takes from the worker."""
    started = time.perf_counter()
    traces.provider.force_flush()
    return (time.perf_counter() - started) / num * 1e6


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    # Below the span queue's 2,048: none dropped, each round's spans exported (and timed) after it.
    ap.add_argument("--requests", type=int, default=2000, help="finished requests per observer per round")
    ap.add_argument("--out", type=Path, default=Path("bench/results/tracing-cpu.json"))
    args = ap.parse_args(argv)

    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    from rill.asgi.http.trace_export import TraceExport  # the flag's one import

    traces = TraceExport(f"http://127.0.0.1:{sink.server_address[1]}/v1/traces")
    metrics = Metrics("rill", "smollm2", 2048)
    access_log.addHandler(logging.StreamHandler(open(os.devnull, "w")))
    access_log.propagate, access_log.level = False, logging.INFO
    observers = {"metrics": metrics.observe, "access_log": log_access, "span": traces.tracer.observe}
    rounds = []
    for _ in range(args.rounds):
        row = {name: per_call_us(fn, args.requests) for name, fn in observers.items()}
        row["span_export"] = flush_us(traces, args.requests)
        row["context_without_headers"] = context_us(args.requests * 4, False)
        row["context_with_headers"] = context_us(args.requests * 4, True)
        rounds.append(row)
    traces.provider.shutdown()
    sink.shutdown()
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    ratios = {"span_vs_metrics_plus_access_log": med["span"] / (med["metrics"] + med["access_log"]),
              "span_with_export_vs_metrics_plus_access_log":
                  (med["span"] + med["span_export"]) / (med["metrics"] + med["access_log"]),
              "context_with_vs_without_headers": med["context_with_headers"] / med["context_without_headers"]}
    report = {"benchmark": "tracing", **provenance("rill.bench.features.tracing", argv, None),
              "params": {"rounds": args.rounds, "requests": args.requests}, "rounds": rounds, "median_us": med,
              "ratios": ratios}
    lines = ["# Tracing: what a span per request costs an API worker", "",
             f"`{report['command']}` on {report['date']}, {report['machine']['cpu_count']} CPUs, medians of "
             f"{args.rounds} interleaved rounds, microseconds per finished request:", "",
             "| observer | us |", "| --- | --- |",
             *(f"| {name} | {med[name]:.2f} |" for name in ("metrics", "access_log", "span", "span_export")), "",
             f"Tracing on: the span observer on the event loop (built, ended, queued) costs "
             f"**{ratios['span_vs_metrics_plus_access_log']:.2f}x** what the metrics and the access line cost "
             f"together; with its export (encoded and posted by the SDK's thread, timed here as a flush) "
             f"**{ratios['span_with_export_vs_metrics_plus_access_log']:.2f}x**. Tracing off: no span code runs; a RequestContext made with the headers "
             f"reference takes {med['context_with_headers']:.3f} us against {med['context_without_headers']:.3f} "
             f"us without (**{ratios['context_with_vs_without_headers']:.2f}x**).", ""]
    save_results(args.out, report, "\n".join(lines))
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
