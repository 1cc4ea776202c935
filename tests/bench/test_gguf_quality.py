"""bench.kernels.gguf_quality: llama-perplexity's chunks and scoring, its output parsed, a quick run where it is built."""
from __future__ import annotations

import json

import pytest

from rill.bench.kernels import gguf_quality
from rill.bench.peers import llama_cpp
from rill.bench.peers.sides import died_of_a_signal
from rill.engine_proc.model import gguf_dir
from rill.engine_proc.model.bundled import bundled_gguf_path, ensure_bundled_model


def test_chunks_are_llama_perplexitys():
    ids = list(range(10))
    assert gguf_quality.chunks_of(ids, 4, 2, None) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert gguf_quality.chunks_of(ids, 4, 2, 99) == [[99, 1, 2, 3], [99, 5, 6, 7]]  # BOS first where it is added
    with pytest.raises(ValueError, match="fewer than 3 chunks of 4"):
        gguf_quality.chunks_of(ids, 4, 3, None)


def test_the_final_estimate_is_parsed_or_missed_loudly():
    assert gguf_quality.parse_final("[1]15.3,[2]16.1,\nFinal estimate: PPL = 15.9876 +/- 0.12345\n") == (15.9876, 0.12345)
    with pytest.raises(ValueError, match="no final estimate"):
        gguf_quality.parse_final("perplexity: calculating perplexity over 16 chunks\n")


def test_the_bundled_files_vocabulary_adds_no_bos():
    assert gguf_quality.bos_id(bundled_gguf_path()) is None


def test_the_files_types_are_counted():
    assert gguf_quality.file_types(bundled_gguf_path()) == "Q4_1 x 210; embedding Q8_0"  # 30 layers x 7 linears


def test_the_from_floats_view_hides_the_source_file(tmp_path):
    model_dir = ensure_bundled_model()
    view = gguf_quality.without_source(model_dir, tmp_path)
    assert gguf_dir.source_gguf(model_dir) == bundled_gguf_path().resolve() and gguf_dir.source_gguf(view) is None
    assert {p.name for p in view.iterdir()} == {p.name for p in model_dir.iterdir()} - {gguf_dir.SOURCE_FILE_NAME}


@pytest.mark.skipif(not llama_cpp.is_built(), reason="llama.cpp is not built here (python -m rill.bench.peers.llama_cpp: "
                    "about 20 minutes on 2 cores; CI never builds it)")
def test_quick_run_against_llama_perplexity(tmp_path):
    out = tmp_path / "q.json"
    try:
        report = gguf_quality.main(["--chunks", "1", "--ctx", "128", "--out", str(out)])
    except RuntimeError as exc:  # llama.cpp's own AMX kernels die of SIGILL on some Intel VMs (docs/measured.md)
        if (why := died_of_a_signal(exc)) is None:
            raise
        pytest.skip(f"llama-server {why}: llama.cpp's build does not run on this CPU")
    results = report["results"]
    assert results["same_tokens"] and results["llama_cpp"]["ppl"] > 1
    for row in results["rows"]:  # the same file on both sides: within a few percent of llama.cpp's
        assert row["scored_tokens"] == 63 and abs(row["ppl_prefill"] / results["llama_cpp"]["ppl"] - 1) < 0.05, row
    assert json.loads(out.read_text())["benchmark"] == "gguf_quality" and "llama.cpp" in out.with_suffix(".md").read_text()
