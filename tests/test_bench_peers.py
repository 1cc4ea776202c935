"""`python -m bench.peers --quick` end to end: it starts rill serve and transformers serve, runs transformers, and writes the four ratios."""
from __future__ import annotations

import json
import math
import subprocess
import sys

from bench.servers import ROOT


def test_quick_run_writes_four_positive_ratios(model_dir, tmp_path):
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, "-m", "bench.peers", "--quick", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "peers" and report["params"]["quick"] is True
    assert "bench.peers --quick" in report["command"] and report["date"] and report["machine"]["name"]
    results = report["results"]
    assert set(results) == {"throughput", "itl", "ttft", "serve_throughput"}
    for name, row in results.items():
        for key in ("rill", "transformers", "ratio"):
            assert math.isfinite(row[key]) and row[key] > 0, (name, key, row[key])
        assert math.isclose(row["ratio"], row["rill"] / row["transformers"])
        assert isinstance(row["pass"], bool) and row["target"]
    sizes, (round_,) = report["params"]["sizes"], report["rounds"]
    assert round_["rill"]["num_output_tokens"] == round_["transformers"]["num_output_tokens"] \
        == round_["transformers_serve"]["num_output_tokens"] == sizes["num_prompts"] * sizes["output_len"]
    assert len(round_["rill"]["ttfts_ms"]) == len(round_["transformers"]["prefills_ms"]) == sizes["num_ttft_requests"]
    md = out.with_suffix(".md").read_text()
    assert "PASS" in md or "FAIL" in md
    assert ">= 3x" in md and "<= 0.8x" in md and "<= 1.2x" in md and ">= 4x" in md
