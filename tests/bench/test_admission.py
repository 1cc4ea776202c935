"""rill.bench.features.admission --quick runs end to end: the flood is refused with 429s while the measured streams run."""
import math

from rill.bench.features import admission


def test_quick_run_refuses_the_flood(tmp_path):
    report = admission.main(["--quick", "--out", str(tmp_path / "adm.json")])
    assert (tmp_path / "adm.json").is_file() and "refused flood" in (tmp_path / "adm.md").read_text()
    kinds = [r["flood"] for r in report["overload_rounds"]]
    assert kinds == ["none", "refused", "health"]
    refused, health = report["overload_rounds"][1], report["overload_rounds"][2]
    assert refused["status_counts"].get("429", 0) > 0 and set(health["status_counts"]) == {"200"}
    assert report["num_refused"] == refused["status_counts"]["429"]
    assert all(math.isfinite(v) and v > 0 for v in report["ratios"].values())
