"""Metrics without a server: the registry and its names, per-token ITL, the engine's request timings."""
from __future__ import annotations

import queue
from types import SimpleNamespace

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rill.asgi.http import request_context
from rill.asgi.http.request_context import RequestContext
from rill.asgi.routes.metrics import TTFT_BUCKETS, Metrics, buckets_1_2_5
from rill.engine_proc.core import EngineCore
from rill.engine_proc.sample.sampler import SamplerOutput
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc import protocol as p

VLLM_NAMES = {  # the families vLLM dashboards read, as the parser names them (counters without _total)
    "time_to_first_token_seconds", "inter_token_latency_seconds", "request_time_per_output_token_seconds",
    "e2e_request_latency_seconds", "request_queue_time_seconds", "request_prefill_time_seconds",
    "request_decode_time_seconds", "request_inference_time_seconds", "request_prompt_tokens",
    "request_generation_tokens", "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
    "prefix_cache_queries", "prefix_cache_hits", "num_preemptions", "prompt_tokens", "generation_tokens",
    "request_success",
}
IDLE = p.EngineStats(num_running=0, num_waiting=0, num_free_blocks=10, num_total_blocks=10, num_aborted=0,
                     num_finished=0)

ENGINE_0 = (("engine", "0"),)  # the engine series' labels besides model_name

def samples(text: bytes) -> dict[tuple, float]:
    """{(sample name, (label, value) pairs without model_name): value}, parsed as Prometheus does."""
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))] = s.value
    return out


def finished_ctx(path="/v1/chat/completions", status=200, finish="stop", prompt=5, gaps=(0.5, 0.25)) -> RequestContext:
    ctx = RequestContext("r", "POST", path, start_s=10.0)
    ctx.status, ctx.finish_reason, ctx.prompt_tokens, ctx.output_tokens = status, finish, prompt, len(gaps) + 1
    ctx.first_token_s = ctx.last_token_s = 10.5
    ctx.itl_s = list(gaps)
    ctx._spans = {0: [10.5, 10.5 + sum(gaps), len(gaps) + 1]}
    ctx.engine_timings = [p.RequestTimings(0.1, 0.4, 0.75)]
    ctx.end_s = 12.0
    return ctx


def test_vllm_prefix_gives_vllm_names_labels_and_buckets():
    metrics = Metrics("vllm", "my-model", max_model_len=2048)
    metrics.observe(finished_ctx())
    text = metrics.render(IDLE)
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert all(name.startswith("vllm:") for name in families), sorted(families)
    assert {name.removeprefix("vllm:") for name in families} >= VLLM_NAMES
    for family in families.values():
        assert all(s.labels["model_name"] == "my-model" for s in family.samples), family.name
    ttft = families["vllm:time_to_first_token_seconds"]
    bounds = [float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket")]
    assert bounds == [*TTFT_BUCKETS, float("inf")]
    assert "vllm:request_success_total" in text.decode() and "_created" not in text.decode()


def test_one_request_lands_in_every_figure_once():
    metrics = Metrics("rill", "m", max_model_len=2048)
    metrics.observe(finished_ctx())
    got = samples(metrics.render(IDLE))
    assert got["rill:prompt_tokens_total", ()] == 5 and got["rill:generation_tokens_total", ()] == 3
    assert got["rill:request_success_total", (("finished_reason", "stop"),)] == 1
    assert got["rill:request_success_total", (("finished_reason", "length"),)] == 0
    assert got["rill:http_responses_total", (("status", "200"),)] == 1
    assert got["rill:e2e_request_latency_seconds_sum", ()] == 2.0
    assert got["rill:time_to_first_token_seconds_sum", ()] == 0.5
    assert got["rill:inter_token_latency_seconds_count", ()] == 2
    assert got["rill:inter_token_latency_seconds_sum", ()] == 0.75
    assert got["rill:request_time_per_output_token_seconds_sum", ()] == 0.375
    assert got["rill:request_queue_time_seconds_sum", ()] == 0.1
    assert got["rill:request_prefill_time_seconds_sum", ()] == 0.4
    assert got["rill:request_decode_time_seconds_sum", ()] == 0.75
    assert got["rill:request_inference_time_seconds_sum", ()] == pytest.approx(1.15)
    assert got["rill:requests_aborted_total", ()] == 0 and got["rill:requests_disconnected_total", ()] == 0
    assert got["rill:num_requests_running", ENGINE_0] == 0 and got["rill:kv_cache_usage_perc", ENGINE_0] == 0


def test_scrapes_errors_and_disconnects():
    metrics = Metrics("rill", "m", max_model_len=2048)
    scrape = RequestContext("s", "GET", "/metrics")
    scrape.status = 200
    odd_scrape = RequestContext("o", "GET", "//metrics/")  # routed as /metrics: a scrape too
    odd_scrape.status = 200
    bad = RequestContext("b", "POST", "/v1/completions")
    bad.status = 400
    gone = finished_ctx(finish="abort")
    gone.disconnected = True
    left_early = RequestContext("e", "POST", "/v1/completions")  # left before any response
    for ctx in (scrape, odd_scrape, bad, gone, left_early):
        metrics.observe(ctx)
    got = samples(metrics.render(None))
    assert got["rill:http_responses_total", (("status", "200"),)] == 1  # the aborted stream, not the scrape
    assert got["rill:http_responses_total", (("status", "400"),)] == 1
    assert got["rill:requests_disconnected_total", ()] == 2
    assert got["rill:requests_aborted_total", ()] == 1
    assert got["rill:request_success_total", (("finished_reason", "abort"),)] == 1
    assert got["rill:e2e_request_latency_seconds_count", ()] == 1
    assert not any(name.startswith("rill:num_requests") for name, _ in got)  # engine down: no engine figures


def test_kv_usage_is_the_fraction_of_blocks_in_use():
    stats = msgspec.structs.replace(IDLE, num_free_blocks=3, num_prefix_queries_tokens=40,
                                    num_prefix_hit_tokens=16, num_preemptions=2, num_running=1)
    got = samples(Metrics("rill", "m", 2048).render(stats))
    assert got["rill:kv_cache_usage_perc", ENGINE_0] == pytest.approx(0.7)
    assert got["rill:prefix_cache_queries_total", ENGINE_0] == 40 and got["rill:prefix_cache_hits_total", ENGINE_0] == 16
    assert got["rill:num_preemptions_total", ENGINE_0] == 2 and got["rill:num_requests_running", ENGINE_0] == 1


def test_each_engine_has_its_own_labelled_series():
    busy = msgspec.structs.replace(IDLE, num_running=3, data_parallel_rank=1)
    got = samples(Metrics("rill", "m", 2048).render([IDLE, busy]))
    assert got["rill:num_requests_running", ENGINE_0] == 0
    assert got["rill:num_requests_running", (("engine", "1"),)] == 3


def test_buckets_1_2_5():
    assert buckets_1_2_5(100) == [1, 2, 5, 10, 20, 50, 100]
    assert buckets_1_2_5(2048)[-1] == 2000


def test_itl_is_per_token_and_merged_ids_share_their_gap(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(request_context.time, "perf_counter", lambda: now[0])
    ctx = RequestContext("r", "POST", "/v1/completions", start_s=0.0)
    for t, num_ids, index in ((1.0, 1, 0), (1.5, 1, 0), (3.0, 3, 0), (3.0, 2, 1), (4.0, 1, 1)):
        now[0] = t
        ctx.token(num_ids, index)
    # choice 0: 5 tokens, 4 gaps (the 3 merged ids share 1.5 s); choice 1: 3 tokens, 2 gaps (its
    # first 2 ids came together: nothing to share but 0)
    assert ctx.itl_s == [0.5, 0.5, 0.5, 0.5, 0.0, 1.0]
    assert ctx.tpot_s == [0.5, 0.5]
    assert ctx.ttft_s == 1.0 and ctx.last_token_s == 4.0


class TickingRunner:
    """Each step takes 0.5 s of the fake clock and samples token 7 for every sampled seq."""

    vocab_size, lora = 1 << 16, None  # the Runner protocol's (engine_proc/model/runner_api.py)

    def __init__(self, now: list[float]):
        self.now = now
        self.kv_cache = SimpleNamespace(num_bytes=0)  # read by EngineCore.stats()

    def execute(self, batch):
        self.now[0] += 0.5
        return SamplerOutput([7] * len(batch.sampled_seqs))


def test_engine_times_queue_prefill_and_decode_across_a_preemption():
    # 4 usable blocks of 4 tokens: a and b (8-token prompts) fill them; a's 9th token preempts b.
    now = [1.0]
    scheduler = Scheduler(BlockManager(5, 4, enable_prefix_caching=False), max_num_seqs=8,
                          max_num_batched_tokens=64, max_model_len=64, eos_token_ids=[2], watermark_blocks=0)
    published = []
    core = EngineCore(scheduler, TickingRunner(now), queue.SimpleQueue(), published.extend, clock=lambda: now[0])
    params = p.SamplingParams(max_tokens=3, ignore_eos=True)
    for req_id in ("a", "b"):
        core.handle(EngineRequest(req_id, "w", list(range(10, 18)), params))
    core.handle(EngineRequest("huge", "w", list(range(100)), params))  # errors out: never scheduled
    now[0] = 2.0  # the engine was busy for a second: both queued 1 s
    while scheduler.has_work:
        batch = scheduler.schedule()
        core.publish_deltas((core.step(batch) if batch else []) + scheduler.take_errored())
    final = {delta.req_id: delta for _, delta, _ in published if delta.finish is not None}
    assert all(delta.timings is None for _, delta, _ in published if delta.finish is None)
    assert final["huge"].finish is p.FinishReason.ERROR and final["huge"].timings is None
    # a: scheduled at 2, first token at 2.5, last at 3.5
    assert final["a"].timings == p.RequestTimings(1.0, 0.5, 1.0)
    # b: first token at 2.5, preempted at 3.0, recomputed after a ends, last token at 4.5;
    # its first scheduling counts, so the recompute is decode time
    assert final["b"].timings == p.RequestTimings(1.0, 0.5, 2.0)
    assert core.stats().num_preemptions == 1
    # the timings ride at the end of the delta and survive the wire
    back = p.output_decoder.decode(p.output_encoder.encode(p.StepOutputs([final["b"]], [7])))
    assert back.deltas[0].timings == p.RequestTimings(1.0, 0.5, 2.0)
