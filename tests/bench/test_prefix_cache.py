"""rill.bench.features.prefix_cache --quick runs end to end and reports a real cache hit."""
from rill.bench.features import prefix_cache


def test_quick_run_reports_a_hit(tmp_path):
    report = prefix_cache.main(["--quick", "--out", str(tmp_path / "pc.json")])
    assert (tmp_path / "pc.json").is_file() and (tmp_path / "pc.md").is_file()
    for row in report["rounds"]:
        assert row["cold_cached_tokens"] == 0
        assert row["warm_cached_tokens"] == 64  # the whole 64-token prefix: 4 full blocks of 16
        assert row["warm_ttft_ms"] > 0 and row["cold_ttft_ms"] > 0
    assert report["median_ratio"] > 0 and report["target"] == 0.25
