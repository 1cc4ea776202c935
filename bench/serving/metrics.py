"""Serving metrics from per-request timings, defined as `vllm bench serve` defines them.

TTFT: send -> first token-bearing chunk. ITL: the gaps between successive token-bearing
chunks (a chunk holding several tokens is one gap). TPOT per request:
(E2EL - TTFT) / (output_len - 1), only for requests with more than one output token.
E2EL: send -> last token-bearing chunk. Throughputs divide by the whole benchmark duration.
Failed requests count in `failed` and nowhere else. Pure: no I/O, no clock.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rill.bench.serving.client import RequestOutput, RequestState

METRIC_NAMES = ("ttft", "tpot", "itl", "e2el")
GOODPUT_METRICS = ("ttft", "tpot", "e2el")


def percentile_key(p: float) -> str:
    """99 -> 'p99', 99.9 -> 'p99.9': vLLM's field naming."""
    return f"p{int(p)}" if int(p) == p else f"p{p}"


def parse_goodput(pairs: Sequence[str]) -> dict[str, float]:
    """['ttft:500', 'tpot:50'] -> {'ttft': 500.0, 'tpot': 50.0}, SLOs in milliseconds."""
    slos_ms: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        try:
            slo_ms = float(value)
        except ValueError:
            slo_ms = math.nan
        if not sep or name not in GOODPUT_METRICS or not slo_ms >= 0:
            raise ValueError(f"goodput SLO {pair!r}: expected NAME:MS with NAME one of "
                             f"{', '.join(GOODPUT_METRICS)} and MS a number >= 0")
        slos_ms[name] = slo_ms
    return slos_ms


def tpot_s(out: RequestOutput) -> float:
    """0 for one-token outputs: vLLM leaves them out of TPOT stats but lets them pass a TPOT SLO."""
    return (out.e2el_s - out.ttft_s) / (out.output_len - 1) if out.output_len > 1 else 0.0


def _stats_ms(name: str, values_s: list[float], percentiles: Sequence[float]) -> dict[str, float]:
    values_ms = np.asarray(values_s or [0.0], dtype=np.float64) * 1000.0
    stats = {f"mean_{name}_ms": float(np.mean(values_ms)), f"median_{name}_ms": float(np.median(values_ms)),
             f"std_{name}_ms": float(np.std(values_ms))}
    for p in percentiles:
        stats[f"{percentile_key(p)}_{name}_ms"] = float(np.percentile(values_ms, p))
    return stats


def _is_good(out: RequestOutput, slos_ms: dict[str, float]) -> bool:
    values_s = {"ttft": out.ttft_s, "tpot": tpot_s(out), "e2el": out.e2el_s}
    return all(values_s[name] * 1000.0 <= slo_ms for name, slo_ms in slos_ms.items())


def peak_output_rate(outputs: Sequence[RequestOutput]) -> tuple[float, int]:
    """vLLM's peak: most token chunks seen in one 1-second bucket, most requests active in one."""
    done = [o for o in outputs if o.success]
    if not done:
        return 0.0, 0
    t0_s = min(o.start_s for o in done)
    num_buckets = int(math.ceil(max(o.start_s + o.e2el_s for o in done) - t0_s)) + 1
    tokens = np.zeros(num_buckets)
    active = np.zeros(num_buckets)
    for o in done:
        token_times_s = o.start_s + o.ttft_s + np.cumsum([0.0, *o.itl_s])
        np.add.at(tokens, np.clip((token_times_s - t0_s).astype(int), 0, num_buckets - 1), 1)
        active[int(o.start_s - t0_s):int(o.start_s + o.e2el_s - t0_s) + 1] += 1
    return float(tokens.max()), int(active.max())


def calculate_metrics(outputs: Sequence[RequestOutput], duration_s: float, percentiles: Sequence[float] = (99,),
                      goodput_slos_ms: dict[str, float] | None = None) -> dict:
    """The vLLM-named metric fields of a result. Every output_len must already be known."""
    done = [o for o in outputs if o.success]
    ttfts_s = [o.ttft_s for o in done]
    tpots_s = [tpot_s(o) for o in done if o.output_len > 1]
    itls_s = [gap for o in done for gap in o.itl_s]
    e2els_s = [o.e2el_s for o in done]
    total_input_tokens = sum(o.prompt_len for o in done)
    total_output_tokens = sum(o.output_len for o in done)
    peak_tokens_per_s, peak_concurrency = peak_output_rate(done)
    metrics = {
        "duration": duration_s,
        "completed": len(done),
        "failed": sum(o.state is RequestState.FAILED for o in outputs),
        "total_input_tokens": total_input_tokens,
        "total_output_tokens": total_output_tokens,
        "request_throughput": len(done) / duration_s,
        "request_goodput": (sum(_is_good(o, goodput_slos_ms) for o in done) / duration_s
                            if goodput_slos_ms else None),
        "output_throughput": total_output_tokens / duration_s,
        "total_token_throughput": (total_input_tokens + total_output_tokens) / duration_s,
        "max_output_tokens_per_s": peak_tokens_per_s,
        "max_concurrent_requests": peak_concurrency,
    }
    for name, values_s in zip(METRIC_NAMES, (ttfts_s, tpots_s, itls_s, e2els_s)):
        metrics.update(_stats_ms(name, values_s, percentiles))
    return metrics
