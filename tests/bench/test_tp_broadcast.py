"""rill.bench.ipc.tp_broadcast --quick: both transports deliver every message intact, and the report has every
field; timings are not checked (this machine is shared)."""
from __future__ import annotations

import json
import os
from pathlib import Path

from rill.bench.ipc import tp_broadcast

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"

FIELDS = {"median_us", "p99_us", "mean_us", "max_us", "reader_cpu_us_per_msg", "num_intact", "num_expected",
          "num_timed"}


def test_quick_run_delivers_every_message_and_writes_only_when_asked(tmp_path):
    out = tmp_path / "tp_broadcast-test.json"
    before = set(RESULTS.glob("tp_broadcast-*"))
    returned = tp_broadcast.main(["--quick"])
    assert set(RESULTS.glob("tp_broadcast-*")) == before  # --quick alone writes nothing
    tp_broadcast.main(["--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    for result in (returned, report):
        assert {"benchmark", "command", "date", "machine", "params", "results"} <= result.keys()
        assert result["machine"]["cpu_model"] and "cpu_flags" in result["machine"]
        assert set(result["results"]) == {"readers_1"}
        by_size = result["results"]["readers_1"]
        assert set(by_size) == set(tp_broadcast.SIZES)
        for row in by_size.values():
            for transport in tp_broadcast.TRANSPORTS:
                fields = row[transport]
                assert FIELDS <= fields.keys()
                assert fields["num_intact"] == fields["num_expected"] == \
                    tp_broadcast.QUICK_NUM_MSGS + tp_broadcast.QUICK_NUM_WARMUP
                assert fields["num_timed"] == tp_broadcast.QUICK_NUM_MSGS
                assert 0 < fields["median_us"] <= fields["p99_us"] <= fields["max_us"]
            assert set(row["gloo_over_shm"]) == {"median", "p99"}
    assert "| 2KB" in out.with_suffix(".md").read_text()
    assert not list(Path("/dev/shm").glob(f"rill_bench_tp_{os.getpid()}_*"))  # the segment is gone
