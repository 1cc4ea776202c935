"""GET /metrics: Prometheus text, request figures from every API worker plus the engine's own.

Names, labels and buckets are vLLM's (`vllm:time_to_first_token_seconds{model_name=...}`) under
`--metrics-prefix` (default `rill`), so `--metrics-prefix vllm` serves vLLM dashboards unchanged.

Correct with any number of workers: each worker counts the requests it served into its own
files under PROMETHEUS_MULTIPROC_DIR (prometheus_client's multiprocess mode; the launcher sets
it to a folder of the run dir), and whichever worker answers a scrape sums every worker's files.
The engine's figures (running, waiting, KV usage, prefix cache, preemptions) are asked of the
engine at scrape time, never summed across workers. Workers hold no gauges, so no gauge
multiprocess mode is needed.
"""
from __future__ import annotations

import os
import re

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from rill.asgi.engine_link.client import EngineDead
from rill.asgi.http.paths import normalize
from rill.asgi.http.primitives import send_response
from rill.asgi.http.request_context import RequestContext
from rill.asgi.http.router import HTTPRequest
from rill.ipc.protocol import EngineStats

METRICS_PATH = "/metrics"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
PREFIX_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
FINISH_REASONS = ("stop", "length", "abort", "error", "timeout")  # timeout: --request-timeout ended it

# vLLM's buckets (vllm/v1/metrics/loggers.py).
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
TOKEN_LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0]
REQUEST_LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's token-count buckets)."""
    out, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return out
            out.append(mantissa * scale)
        scale *= 10


def multiprocess_enabled() -> bool:
    """True when the launcher set PROMETHEUS_MULTIPROC_DIR for this process.

    prometheus_client picks its value class (in memory, or mmapped files) when first imported.
    Granian forks the workers from the launcher, so a copy imported before the launcher set the
    variable would count in memory, per worker: switch it over before any metric exists.
    """
    if not os.environ.get(MULTIPROC_ENV):
        return False
    if not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.get_value_class()
    return True


class Metrics:
    """One worker's metrics: `observe(ctx)` is a WorkerState observer, `render(stats)` the page."""

    def __init__(self, prefix: str, model_name: str, max_model_len: int):
        assert PREFIX_RE.match(prefix), prefix
        disable_created_metrics()  # no `_created` series, as vLLM (and as multiprocess mode has none)
        self.prefix = prefix
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=False)  # this process's own, read when alone
        self.multiprocess = multiprocess_enabled()
        self._all_workers = None
        if self.multiprocess:
            self._all_workers = CollectorRegistry(auto_describe=False)
            MultiProcessCollector(self._all_workers)
        token_buckets = buckets_1_2_5(max_model_len)
        counter, histogram = self._counter, self._histogram
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        success = Counter(f"{prefix}:request_success", "Count of finished requests, by finish reason.",
                          ["model_name", "finished_reason"], registry=self.registry)
        self.request_success = {r: success.labels(model_name, r) for r in FINISH_REASONS}
        self.aborted = counter("requests_aborted", "Requests that ended before the engine finished them.")
        self.disconnected = counter("requests_disconnected",
                                    "HTTP requests whose client went away before the response ended.")
        self._http_responses = Counter(f"{prefix}:http_responses", "HTTP responses sent, by status.",
                                       ["model_name", "status"], registry=self.registry)
        self.ttft = histogram("time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Inter-token latency in seconds.",
                             TOKEN_LATENCY_BUCKETS)
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "Time per output token after the first, per request, in seconds.",
                              TOKEN_LATENCY_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Time spent in WAITING phase for request.",
                               REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("request_prefill_time_seconds", "Time spent in PREFILL phase for request.",
                                 REQUEST_LATENCY_BUCKETS)
        self.decode = histogram("request_decode_time_seconds", "Time spent in DECODE phase for request.",
                                REQUEST_LATENCY_BUCKETS)
        self.inference = histogram("request_inference_time_seconds", "Time spent in RUNNING phase for request.",
                                   REQUEST_LATENCY_BUCKETS)
        self.request_prompt_tokens = histogram("request_prompt_tokens", "Number of prefill tokens processed.",
                                               token_buckets)
        self.request_generation_tokens = histogram("request_generation_tokens",
                                                   "Number of generation tokens processed.", token_buckets)

    def _counter(self, name: str, doc: str):
        return Counter(f"{self.prefix}:{name}", doc, ["model_name"], registry=self.registry).labels(self.model_name)

    def _histogram(self, name: str, doc: str, buckets):
        return Histogram(f"{self.prefix}:{name}", doc, ["model_name"], buckets=buckets,
                         registry=self.registry).labels(self.model_name)

    def observe(self, ctx: RequestContext) -> None:
        """Counts one finished HTTP request (scrapes of /metrics excepted)."""
        if normalize(ctx.path) == METRICS_PATH:  # as routed: `//metrics/` is a scrape too
            return
        if ctx.status:
            self._http_responses.labels(self.model_name, str(ctx.status)).inc()
        if ctx.disconnected or not ctx.status:
            self.disconnected.inc()
        if ctx.finish_reason is None:  # no generation: not a request in vLLM's sense
            return
        self.request_success[ctx.finish_reason].inc()
        if ctx.finish_reason == "abort":
            self.aborted.inc()
        self.prompt_tokens.inc(ctx.prompt_tokens)
        self.generation_tokens.inc(ctx.output_tokens)
        self.request_prompt_tokens.observe(ctx.prompt_tokens)
        self.request_generation_tokens.observe(ctx.output_tokens)
        self.e2e.observe(ctx.duration_s)
        if ctx.ttft_s is not None:
            self.ttft.observe(ctx.ttft_s)
        for gap_s in ctx.itl_s:
            self.itl.observe(gap_s)
        for tpot_s in ctx.tpot_s:
            self.tpot.observe(tpot_s)
        for t in ctx.engine_timings:
            self.queue.observe(t.queue_s)
            self.prefill.observe(t.prefill_s)
            self.decode.observe(t.decode_s)
            self.inference.observe(t.prefill_s + t.decode_s)

    def render(self, stats: EngineStats | list[EngineStats] | None) -> bytes:
        """Every worker's counts and histograms, then each engine's figures (absent if it is down)."""
        text = generate_latest(self._all_workers if self.multiprocess else self.registry)
        if stats is not None:
            per_engine = stats if isinstance(stats, list) else [stats]
            text += generate_latest(EngineFigures(self.prefix, self.model_name, per_engine))
        return text


class EngineFigures:
    """A one-scrape collector over EngineStats snapshots: a sample per engine, labelled `engine` with its
    rank, as vLLM labels its engines' series (--data-parallel-size)."""

    def __init__(self, prefix: str, model_name: str, per_engine: list[EngineStats]):
        self.prefix = prefix
        self.model_name = model_name
        self.per_engine = per_engine

    def collect(self):
        families = {}
        for s in self.per_engine:
            for family, metric, doc, value in self._figures(s):
                if metric not in families:
                    families[metric] = family(f"{self.prefix}:{metric}", doc, labels=["model_name", "engine"])
                families[metric].add_metric([self.model_name, str(s.data_parallel_rank)], value)
        yield from families.values()
        if any(s.by_priority for s in self.per_engine):  # --scheduling-policy priority
            yield from self._by_priority()
        if any(s.spec_accepted_per_pos for s in self.per_engine):  # speculative decoding is on
            per_pos = CounterMetricFamily(f"{self.prefix}:spec_decode_num_accepted_tokens_per_pos",
                                          "Accepted draft tokens by their position in the draft.",
                                          labels=["model_name", "engine", "position"])
            for s in self.per_engine:
                for pos, count in enumerate(s.spec_accepted_per_pos):
                    per_pos.add_metric([self.model_name, str(s.data_parallel_rank), str(pos)], count)
            yield per_pos

    def _by_priority(self):
        """Running and waiting requests by the priority they asked for (a bounded set of label values)."""
        families = [GaugeMetricFamily(f"{self.prefix}:num_requests_{state}_by_priority",
                                      f"Number of requests {state} by requested priority (lower runs first).",
                                      labels=["model_name", "engine", "priority"]) for state in ("running", "waiting")]
        for s in self.per_engine:
            for priority, counts in s.by_priority.items():
                for family, count in zip(families, counts):
                    family.add_metric([self.model_name, str(s.data_parallel_rank), priority], count)
        return families

    @staticmethod
    def _figures(s: EngineStats):
        usage = 1.0 - s.num_free_blocks / s.num_total_blocks if s.num_total_blocks else 0.0
        return (
            (GaugeMetricFamily, "num_requests_running", "Number of requests in model execution batches.",
             s.num_running),
            (GaugeMetricFamily, "num_requests_waiting", "Number of requests waiting to be processed.",
             s.num_waiting),
            (GaugeMetricFamily, "kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
            (CounterMetricFamily, "prefix_cache_queries",
             "Prefix cache queries, in terms of number of queried tokens.", s.num_prefix_queries_tokens),
            (CounterMetricFamily, "prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
             s.num_prefix_hit_tokens),
            (CounterMetricFamily, "num_preemptions", "Cumulative number of preemption from the engine.",
             s.num_preemptions),
            (CounterMetricFamily, "jump_forward_draft_tokens",
             "Draft tokens that structured outputs' grammars forced (--jump-forward-tokens).", s.num_jump_forward_tokens),
            (CounterMetricFamily, "jump_forward_accepted_tokens", "Of those, the tokens the model accepted.",
             s.num_jump_forward_accepted),
        ) + (() if not s.spec_accepted_per_pos else (
            (CounterMetricFamily, "spec_decode_num_drafts", "Number of spec decoding drafts.", s.num_spec_drafts),
            (CounterMetricFamily, "spec_decode_num_draft_tokens", "Number of draft tokens.",
             s.num_spec_draft_tokens),
            (CounterMetricFamily, "spec_decode_num_accepted_tokens", "Number of accepted tokens.",
             s.num_spec_accepted_tokens),
        ))


async def metrics_endpoint(http: HTTPRequest) -> None:
    """GET /metrics. Open to all unless the server guards it (see README, "Metrics")."""
    state = http.state
    try:
        stats = await state.client.stats_per_engine()
    except (EngineDead, TimeoutError):  # the workers' own figures still go out
        stats = None
    await send_response(http.send, 200, state.metrics.render(stats), content_type=CONTENT_TYPE_LATEST.encode())
