"""One API worker's OpenTelemetry tracer provider (--otlp-traces-endpoint): OTLP over HTTP, batched, never blocking.

Started in each worker's lifespan, after Granian forked it: the SDK's export thread and its HTTP connection
belong to one process. Spans leave through the SDK's BatchSpanProcessor, whose thread of its own encodes and
posts them (OTLP http/protobuf), so a slow or absent collector never holds up the event loop and never fails a
request: when its queue (2,048 spans) is full, spans are dropped. Its failures are logged at most once a minute
per message, with the count left out. The OTEL_* variables the SDK reads still apply (OTEL_BSP_SCHEDULE_DELAY,
OTEL_EXPORTER_OTLP_TRACES_HEADERS, OTEL_EXPORTER_OTLP_TRACES_TIMEOUT, OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES).
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from importlib.metadata import PackageNotFoundError, version

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import PROCESS_PID, SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from rill.asgi.http.tracing import RequestTracer

SERVICE = "rill"
LOG_EVERY_S = 60.0
# Shutdown waits this long for the last spans; a collector that is down would otherwise hold the worker's exit
# for the exporter's whole timeout and retries (10 s). The SDK's force_flush ignores its timeout: the shutdown runs
# in a daemon thread of its own, left behind past this.
SHUTDOWN_WAIT_S = 3.0
log = logging.getLogger("rill.api")


class OncePerInterval(logging.Filter):
    """Lets a message (its template, per logger) through once per `interval_s`; the next one says how many were
    held back. An unreachable collector fails every export, every few seconds, in every worker."""

    def __init__(self, interval_s: float = LOG_EVERY_S):
        super().__init__()
        self.interval_s = interval_s
        self._last: dict[tuple[str, object], tuple[float, int]] = {}  # (logger, msg) -> (last let through, held)

    def filter(self, record: logging.LogRecord) -> bool:
        key, now = (record.name, record.msg), time.monotonic()
        last_s, held = self._last.get(key, (float("-inf"), 0))
        if now - last_s < self.interval_s:
            self._last[key] = (last_s, held + 1)
            return False
        self._last[key] = (now, 0)
        if held:
            record.msg = f"{record.msg} ({held} more like it in the last {now - last_s:.0f} s)"
        return True


def quiet_exporter_logs(interval_s: float = LOG_EVERY_S) -> None:
    """Rate-limits every OpenTelemetry logger that exists by now (the SDK's and the exporter's are made when their
    modules are imported, which this module's imports did): a filter is per logger, not inherited."""
    limiter = OncePerInterval(interval_s)
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if name.startswith("opentelemetry") and isinstance(logger, logging.Logger):
            logger.addFilter(limiter)


def service_resource() -> Resource:
    """service.name "rill" unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES names one (as the SDK reads them),
    and this worker's process.pid."""
    attrs = {PROCESS_PID: os.getpid()}  # which API worker
    try:
        attrs[SERVICE_VERSION] = version("rill")
    except PackageNotFoundError:  # run from a tree that was never installed
        pass
    resource = Resource.create(attrs)
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: SERVICE}))
    return resource


class TraceExport:
    """This worker's tracer provider and the observer that feeds it; `close()` at the worker's shutdown."""

    def __init__(self, endpoint: str, exporter=None):
        quiet_exporter_logs()
        self.provider = TracerProvider(resource=service_resource(), shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint)))
        self.tracer = RequestTracer(self.provider.get_tracer("rill.asgi"))
        log.info("exporting a span per request to %s (OTLP http/protobuf)", endpoint)

    async def close(self) -> None:
        """Sends the spans still queued and stops the export thread, waiting at most SHUTDOWN_WAIT_S."""
        closing = threading.Thread(target=self.provider.shutdown, name="rill-trace-shutdown", daemon=True)
        closing.start()
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        while closing.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if closing.is_alive():
            log.warning("spans still queued after %.0f s at shutdown were not sent", SHUTDOWN_WAIT_S)
