"""`rill bench compare` and `rill bench sweep`: interleaving, medians, ratios, report files; one real run."""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections import Counter

import pytest

from rill.bench.serving import axis, compare, markdown, serve, sweep
from rill.bench.serving.axis import Axis

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NOISE = [1.0, 0.5, 2.0, 0.9, 1.1]  # per-round multipliers: the median of the first three is 1.0


def fake_result(cfg, output_tok_s: float, ttft_ms: float) -> dict:
    """A result dict with `vllm bench serve`'s field names."""
    result = {"date": "20250101-000000", "model_id": cfg.model or "listed-model", "num_prompts": 4, "request_rate": "inf",
              "max_concurrency": cfg.max_concurrency, "duration": 1.0, "completed": 4, "failed": 0,
              "total_input_tokens": 64, "total_output_tokens": 16, "request_throughput": output_tok_s / 4,
              "request_goodput": None, "output_throughput": output_tok_s,
              "total_token_throughput": output_tok_s * 5, "base_url": cfg.base_url, "label": cfg.label,
              "ttfts": [ttft_ms / 1e3] * 4, "itls": [[0.01] * 3] * 4, "errors": [""] * 4,
              "endpoint": cfg.endpoint}
    for metric, scale in [("ttft", 1.0), ("tpot", 0.2), ("itl", 0.2), ("e2el", 2.0)]:
        for stat, factor in [("mean", 1.0), ("median", 0.9), ("std", 0.1), ("p90", 1.5), ("p99", 2.0)]:
            result[f"{stat}_{metric}_ms"] = ttft_ms * scale * factor
    return result


class FakeBench:
    """run_benchmark's stand-in: server b is 1.5x a's throughput and 0.5x its TTFT; each round adds noise."""

    def __init__(self, fail_url: str | None = None):
        self.calls: list[tuple] = []
        self.fail_url = fail_url

    async def run_benchmark(self, cfg, prompts=None) -> dict:
        assert prompts == ["p0", "p1", "p2", "p3"]  # built once, the same for every run
        self.calls.append((cfg.base_url, cfg.model, cfg.max_concurrency, cfg.request_rate))
        if cfg.base_url == self.fail_url:
            raise ConnectionError("refused")
        setting = cfg.max_concurrency if cfg.request_rate == math.inf else cfg.request_rate
        noise = NOISE[sum(1 for c in self.calls[:-1] if c == self.calls[-1])]
        speed = 1.5 if cfg.base_url.endswith("b") else 1.0
        return fake_result(cfg, 100.0 * setting * speed * noise, 50.0 / speed * noise)


@pytest.fixture
def serve_api(monkeypatch):
    """The real flags and BenchConfig of bench.serving.serve; run_benchmark and build_prompts faked."""
    fake = FakeBench()
    monkeypatch.setattr(serve, "run_benchmark", fake.run_benchmark)
    monkeypatch.setattr(serve, "build_prompts", lambda cfg: ["p0", "p1", "p2", "p3"])
    return fake


def parse(add_args, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_args(parser)
    return parser.parse_args(argv)


def test_server_flag():
    assert compare.parse_server("a=http://h:1/") == compare.Server("a", "http://h:1", None)
    assert compare.parse_server("b=http://h:2@org/model-1") == compare.Server("b", "http://h:2", "org/model-1")
    for bad in ["http://h:1", "=http://h:1", "a=", "a=http://h:1@"]:
        with pytest.raises(argparse.ArgumentTypeError):
            compare.parse_server(bad)


def test_list_flags_and_axis(serve_api):
    assert axis.int_list("1, 8,32") == [1, 8, 32]
    with pytest.raises(argparse.ArgumentTypeError):
        axis.int_list("1,0")
    assert axis.rate_list("0.5,2,inf") == [0.5, 2.0, math.inf]
    args = parse(sweep.add_sweep_args, [])
    assert axis.resolve_axis(args, sweep.DEFAULT_CONCURRENCY) == Axis(
        "max_concurrency", [1, 4, 16, 64], {"request_rate": math.inf})
    args = parse(sweep.add_sweep_args, ["--request-rate", "1,2,4", "--max-concurrency", "8"])
    assert axis.resolve_axis(args, []) == Axis("request_rate", [1.0, 2.0, 4.0], {"max_concurrency": 8})
    args = parse(sweep.add_sweep_args, ["--request-rate", "3", "--max-concurrency", "1,2"])
    assert axis.resolve_axis(args, []) == Axis("max_concurrency", [1, 2], {"request_rate": 3.0})
    with pytest.raises(ValueError, match="not both"):
        axis.resolve_axis(parse(sweep.add_sweep_args, ["--request-rate", "1,2", "--max-concurrency", "1,2"]), [])


def test_interleaving_rotates_and_runs_everything_once():
    fake = FakeBench()
    servers = [compare.Server(x, f"http://{x}", None) for x in "abc"]
    axis = Axis("max_concurrency", [1, 8], {})
    runs = asyncio.run(compare.run_rounds(serve.BenchConfig(model="m"), servers, axis, 3, ["p0", "p1", "p2", "p3"],
                                          fake.run_benchmark, []))
    order = [(r["round"], r["setting"], r["label"]) for r in runs]
    assert order == [(0, 1, "a"), (0, 1, "b"), (0, 1, "c"), (0, 8, "a"), (0, 8, "b"), (0, 8, "c"),
                     (1, 1, "b"), (1, 1, "c"), (1, 1, "a"), (1, 8, "b"), (1, 8, "c"), (1, 8, "a"),
                     (2, 1, "c"), (2, 1, "a"), (2, 1, "b"), (2, 8, "c"), (2, 8, "a"), (2, 8, "b")]
    assert Counter(order) == Counter({key: 1 for key in order}) and len(order) == 3 * 2 * 3
    assert [(url, conc) for url, _, conc, _ in fake.calls] == [(f"http://{label}", setting)
                                                             for _, setting, label in order]
    assert {model for _, model, _, _ in fake.calls} == {"m"}  # the base config's model when none is given


def test_a_failing_server_does_not_stop_the_others():
    fake = FakeBench(fail_url="http://b")
    servers = [compare.Server("a", "http://a"), compare.Server("b", "http://b", "other-model")]
    axis = Axis("max_concurrency", [2], {})
    runs = asyncio.run(compare.run_rounds(serve.BenchConfig(model="m"), servers, axis, 2, ["p0", "p1", "p2", "p3"],
                                          fake.run_benchmark, []))
    assert [("error" in r, r["label"]) for r in runs] == [(False, "a"), (True, "b"), (True, "b"), (False, "a")]
    assert runs[1]["error"] == "ConnectionError: refused"
    assert fake.calls[1][1] == "other-model"
    rows = compare.aggregate(runs, ["a", "b"], [2])
    assert [(row["label"], row["num_rounds"], row["median"]) for row in rows][1] == ("b", 0, {})
    assert compare.ratios(rows, "b")[0]["ratio"] == {}  # no baseline numbers, no ratios


def test_median_aggregation():
    runs = [{"label": "a", "setting": 1, "round": i, "result": {"output_throughput": v, "completed": 4,
                                                                "request_rate": "inf", "ok": True}}
            for i, v in enumerate([10.0, 40.0, 20.0])]
    runs.append({"label": "a", "setting": 1, "round": 3, "error": "x"})
    (row,) = compare.aggregate(runs, ["a"], [1])
    assert row["num_rounds"] == 3
    assert row["median"] == {"output_throughput": 20.0, "completed": 4}  # strings and booleans left out
    assert (row["min"]["output_throughput"], row["max"]["output_throughput"]) == (10.0, 40.0)


def test_ratio_arithmetic_and_direction():
    assert compare.better_when("output_throughput") == "higher"
    assert compare.better_when("request_goodput") == "higher"
    assert compare.better_when("p99_ttft_ms") == "lower"
    assert compare.better_when("completed") is None
    rows = [{"label": "a", "setting": 8, "median": {"output_throughput": 200.0, "mean_ttft_ms": 40.0, "completed": 4}},
            {"label": "b", "setting": 8, "median": {"output_throughput": 300.0, "mean_ttft_ms": 10.0, "completed": 2}}]
    by_label = {r["label"]: r["ratio"] for r in compare.ratios(rows, "a")}
    assert by_label["b"] == {"output_throughput": 1.5, "mean_ttft_ms": 0.25}  # no ratio of counts
    assert by_label["a"] == {"output_throughput": 1.0, "mean_ttft_ms": 1.0}


def test_compare_writes_json_markdown_and_plots(serve_api, tmp_path, monkeypatch):
    argv = ["--server", "a=http://a", "--server", "b=http://b", "--max-concurrency", "1,4", "--rounds", "3",
            "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["rill", "bench", "compare", *argv, "--api-key", "sk-secret"])
    assert compare.main(parse(compare.add_compare_args, argv)) == 0
    assert len(serve_api.calls) == 2 * 2 * 3

    doc = json.loads((tmp_path / "compare.json").read_text())
    assert {"kind", "command", "date", "machine", "config", "axis", "settings", "servers", "baseline",
            "num_rounds", "complete", "runs", "aggregate", "ratios", "better"} <= doc.keys()
    assert (doc["kind"], doc["axis"], doc["settings"], doc["baseline"], doc["complete"]) == (
        "compare", "max_concurrency", [1, 4], "a", True)
    assert len(doc["runs"]) == 12 and all("result" in run for run in doc["runs"])
    assert {run["result"]["label"] for run in doc["runs"]} == {"a", "b"}  # each result names its server
    assert doc["servers"][1] == {"label": "b", "base_url": "http://b", "model": "listed-model"}
    assert not {"ttfts", "itls", "errors"} & doc["runs"][0]["result"].keys()  # per-request lists left out
    rows = {(row["label"], row["setting"]): row for row in doc["aggregate"]}
    assert rows["b", 4]["median"]["output_throughput"] == pytest.approx(600.0)  # noise 1, 0.5, 2 -> median 1
    ratio = {(row["label"], row["setting"]): row["ratio"] for row in doc["ratios"]}
    assert ratio["b", 1]["output_throughput"] == pytest.approx(1.5)
    assert ratio["b", 1]["p99_ttft_ms"] == pytest.approx(2 / 3)
    assert doc["better"]["output_throughput"] == "higher" and doc["better"]["p99_itl_ms"] == "lower"

    report = (tmp_path / "report.md").read_text()
    assert "rill bench compare --server a=http://a" in report and "sk-secret" not in report
    assert f"{doc['machine']['cpu_count']} CPUs" in report
    assert "## max concurrency 1" in report and "## max concurrency 4" in report
    assert "| a (baseline) |" in report and "1.50×" in report and "0.67×" in report
    assert "output tok/s ↑" in report and "p99 TTFT ms ↓" in report and "lower is better" in report
    assert "![latency](latency.png)" in report
    for name in ["latency.png", "throughput.png"]:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_sweep_over_request_rates(serve_api, tmp_path):
    args = parse(sweep.add_sweep_args, ["--request-rate", "1,2,4", "--out", str(tmp_path)])
    assert sweep.main(args) == 0
    assert [rate for *_, rate in serve_api.calls] == [1.0, 2.0, 4.0]
    doc = json.loads((tmp_path / "sweep.json").read_text())
    assert (doc["kind"], doc["axis"], doc["settings"], doc["num_rounds"]) == ("sweep", "request_rate", [1, 2, 4], 1)
    assert [row["median"]["output_throughput"] for row in doc["aggregate"]] == [100.0, 200.0, 400.0]
    report = (tmp_path / "report.md").read_text()
    assert "# rill bench sweep: http://127.0.0.1:8000" in report  # no --label, no --model: the URL and "| request rate (req/s) |" in report
    assert "| 4 | 4 / 0 | 400 |" in report
    for name in ["latency.png", "throughput.png"]:
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_bad_compare_flags(serve_api, tmp_path, capsys):
    args = parse(compare.add_compare_args, ["--server", "a=http://a", "--server", "a=http://b"])
    assert compare.main(args) == 2
    args = parse(compare.add_compare_args, ["--server", "a=http://a", "--baseline", "z"])
    assert compare.main(args) == 2
    assert "--baseline 'z' is not one of ['a']" in capsys.readouterr().err


def test_slim_drops_per_request_lists_and_counts_errors():
    result = {"completed": 3, "failed": 2, "ttfts": [0.1, 0.2, 0.3, 0, 0], "itls": [[0.01]] * 5,
              "input_lens": [16] * 5, "output_lens": [4, 4, 4, 0, 0], "errors": ["", "", "", "timeout", "timeout"]}
    assert compare.slim(result) == {"completed": 3, "failed": 2, "error_counts": {"timeout": 2}}


def test_command_line_hides_the_api_key():
    assert markdown.command_line(["/x/rill", "bench", "compare", "--api-key", "s", "--api-key=t"]) == \
        "rill bench compare --api-key '***' '--api-key=***'"
    assert markdown.command_line(["/r/bench/__main__.py", "sweep"]) == "python -m rill.bench sweep"


@pytest.mark.e2e
def test_compare_one_real_server_under_two_labels(server, tmp_path, monkeypatch):
    # The session's shared server: any real one will do, and a start of its own cost ~6 s.
    argv = ["--server", f"first={server.base_url}", "--server", f"second={server.base_url}",
            "--num-prompts", "4", "--random-input-len", "16", "--random-output-len", "4",
            "--max-concurrency", "1,2", "--rounds", "1", "--num-warmups", "0", "--disable-tqdm",
            "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", ["rill", "bench", "compare", *argv])
    assert compare.main(parse(compare.add_compare_args, argv)) == 0
    doc = json.loads((tmp_path / "compare.json").read_text())
    assert [(r["label"], r["setting"], r["result"]["completed"]) for r in doc["runs"]] == [
        ("first", 1, 4), ("second", 1, 4), ("first", 2, 4), ("second", 2, 4)]
    for row in doc["ratios"]:
        for metric in ["output_throughput", "mean_ttft_ms"]:
            assert 0 < row["ratio"][metric] < 100  # the same server: noisy, yet positive and finite
        # 4 tokens may all come in one read (a clean clone's run: a mean ITL of 0 ms, so a ratio of 0; over a baseline
        # of 0 none is taken): the ITL's ratio is finite where there is one.
        assert 0 <= row["ratio"].get("mean_itl_ms", 0) < 100
    report = (tmp_path / "report.md").read_text()
    assert "| first (baseline) |" in report and "×" in report
    for name in ["latency.png", "throughput.png"]:
        assert (tmp_path / name).stat().st_size > 10_000
