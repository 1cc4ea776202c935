"""bench/serving/metrics.py on synthetic timings, against numbers worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest

from rill.bench.serving.client import RequestOutput, RequestState
from rill.bench.serving.metrics import calculate_metrics, parse_goodput, percentile_key, tpot_s


def done(prompt_len: int, start_s: float, token_times_s: list[float], output_len: int | None = None) -> RequestOutput:
    """A completed request whose token-bearing chunks arrived at the given absolute times."""
    return RequestOutput(prompt_len=prompt_len, state=RequestState.COMPLETED, start_s=start_s,
                         ttft_s=token_times_s[0] - start_s,
                         itl_s=list(np.diff(token_times_s)), e2el_s=token_times_s[-1] - start_s,
                         output_len=len(token_times_s) if output_len is None else output_len,
                         output_len_source="usage")


# A: sent at 0, tokens at 0.1, 0.3, 0.6 -> TTFT 100 ms, ITLs 200 and 300 ms, E2EL 600 ms,
#    TPOT (600 - 100) / 2 = 250 ms.
# B: sent at 1, tokens at 1.2, 1.3 -> TTFT 200 ms, ITL 100 ms, E2EL 300 ms, TPOT 100 ms.
# C: sent at 2, one token at 2.4 -> TTFT 400 ms, no ITL, E2EL 400 ms, no TPOT.
# D: failed after a token: excluded from everything but `failed`.
A = done(10, 0.0, [0.1, 0.3, 0.6])
B = done(20, 1.0, [1.2, 1.3])
C = done(30, 2.0, [2.4])
D = RequestOutput(prompt_len=1000, state=RequestState.FAILED, start_s=0.5, ttft_s=5.0, itl_s=[9.0],
                  e2el_s=50.0, output_len=0, error="HTTP 500: boom")
OUTPUTS = [A, B, C, D]
DURATION_S = 4.0


@pytest.fixture
def metrics() -> dict:
    return calculate_metrics(OUTPUTS, DURATION_S, percentiles=[50, 90, 99])


def test_counts_and_totals(metrics):
    assert (metrics["completed"], metrics["failed"]) == (3, 1)
    assert metrics["total_input_tokens"] == 60  # D's 1000 are not counted
    assert metrics["total_output_tokens"] == 6
    assert metrics["duration"] == DURATION_S


def test_throughputs(metrics):
    assert metrics["request_throughput"] == pytest.approx(3 / 4)
    assert metrics["output_throughput"] == pytest.approx(6 / 4)
    assert metrics["total_token_throughput"] == pytest.approx(66 / 4)
    assert metrics["request_goodput"] is None  # no SLOs given


def test_ttft(metrics):
    assert metrics["mean_ttft_ms"] == pytest.approx((100 + 200 + 400) / 3)
    assert metrics["median_ttft_ms"] == pytest.approx(200)
    assert metrics["std_ttft_ms"] == pytest.approx(np.std([100, 200, 400]))
    # numpy's linear percentile over [100, 200, 400]: p90 at rank 1.8 -> 200 + 0.8 * 200.
    assert metrics["p90_ttft_ms"] == pytest.approx(360)
    assert metrics["p50_ttft_ms"] == pytest.approx(200)


def test_itl_pools_every_gap(metrics):
    # Gaps 200, 300 (A) and 100 (B).
    assert metrics["mean_itl_ms"] == pytest.approx(200)
    assert metrics["median_itl_ms"] == pytest.approx(200)
    assert metrics["p99_itl_ms"] == pytest.approx(200 + 0.98 * 100)


def test_tpot_skips_single_token_requests(metrics):
    assert tpot_s(A) == pytest.approx(0.25)
    assert tpot_s(C) == 0.0
    assert metrics["mean_tpot_ms"] == pytest.approx((250 + 100) / 2)
    assert metrics["median_tpot_ms"] == pytest.approx(175)
    assert metrics["std_tpot_ms"] == pytest.approx(75)


def test_e2el(metrics):
    assert metrics["mean_e2el_ms"] == pytest.approx((600 + 300 + 400) / 3)
    assert metrics["median_e2el_ms"] == pytest.approx(400)
    assert metrics["p90_e2el_ms"] == pytest.approx(400 + 0.8 * 200)


def test_tpot_uses_the_token_count_not_the_chunk_count():
    # Two chunks carrying 5 tokens: TPOT = (1.0 - 0.2) / (5 - 1), while the one ITL is 800 ms.
    out = done(4, 0.0, [0.2, 1.0], output_len=5)
    metrics = calculate_metrics([out], 1.0)
    assert metrics["mean_tpot_ms"] == pytest.approx(200)
    assert metrics["mean_itl_ms"] == pytest.approx(800)


def test_goodput_needs_every_slo():
    slos_ms = {"ttft": 250, "tpot": 200}
    # A: TTFT 100 ok, TPOT 250 too slow. B: 200 / 100 good. C: TTFT 400 too slow (its TPOT counts as 0).
    assert calculate_metrics(OUTPUTS, DURATION_S, goodput_slos_ms=slos_ms)["request_goodput"] == pytest.approx(1 / 4)
    loose = {"ttft": 1000, "tpot": 1000, "e2el": 1000}
    assert calculate_metrics(OUTPUTS, DURATION_S, goodput_slos_ms=loose)["request_goodput"] == pytest.approx(3 / 4)
    # An SLO is met at equality, as vLLM's `slo >= value`.
    assert calculate_metrics(OUTPUTS, DURATION_S, goodput_slos_ms={"e2el": 400})["request_goodput"] == \
        pytest.approx(2 / 4)


def test_not_sent_and_cancelled_are_neither_completed_nor_failed():
    extra = [RequestOutput(prompt_len=5, state=RequestState.NOT_SENT),
             RequestOutput(prompt_len=5, state=RequestState.CANCELLED, start_s=1.0)]
    metrics = calculate_metrics(OUTPUTS + extra, DURATION_S)
    assert (metrics["completed"], metrics["failed"]) == (3, 1)


def test_all_failed_gives_zeros_not_errors():
    metrics = calculate_metrics([D], 1.0, percentiles=[99])
    assert metrics["completed"] == 0 and metrics["failed"] == 1
    assert metrics["mean_ttft_ms"] == metrics["p99_e2el_ms"] == 0.0
    assert metrics["max_output_tokens_per_s"] == 0.0


def test_peak_output_rate_and_concurrency(metrics):
    # Token chunks per 1 s bucket from t=0: [0.1, 0.3, 0.6] -> 3, [1.2, 1.3] -> 2, [2.4] -> 1.
    assert metrics["max_output_tokens_per_s"] == 3.0
    assert metrics["max_concurrent_requests"] == 1


def test_percentile_names_and_goodput_parsing():
    assert [percentile_key(p) for p in (90, 99.0, 99.9)] == ["p90", "p99", "p99.9"]
    assert parse_goodput(["ttft:500", "tpot:50.5", "e2el:0"]) == {"ttft": 500.0, "tpot": 50.5, "e2el": 0.0}
    for bad in (["itl:5"], ["ttft"], ["ttft:abc"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_goodput(bad)
