"""bench.families' models: each family's config builds, takes the route the table says, and its
directory is one `rill serve --load-format dummy` can serve (the bundled tokenizer, its vocabulary).
And bench.kernels.moe_experts runs."""
from __future__ import annotations

import json

import pytest

from rill.bench.families import SHAPE, family_configs, write_model_dir
from rill.engine_proc.attention.kv_layout import layer_kv_shapes
from rill.engine_proc.model.choice import choose_runner
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from rill.engine_proc.model.loader import load_config
from rill.engine_proc.model.runner import ModelRunner

NATIVE = {"llama", "qwen3", "granite", "smollm3", "phi3"}


@pytest.mark.parametrize("name", sorted(family_configs()))
def test_each_family_takes_its_route_at_the_shared_shape(name, tmp_path):
    model_dir = write_model_dir(family_configs()[name], tmp_path / name)
    config = load_config(model_dir)
    assert choose_runner("auto", config) is (ModelRunner if name in NATIVE else PagedTransformersRunner)
    assert (config.hidden_size, config.num_hidden_layers, layer_kv_shapes(config)[0][1]) == (256, 4, 64)
    tokenizer = json.loads((model_dir / "tokenizer.json").read_text())
    assert len(tokenizer["model"]["vocab"]) == SHAPE["vocab_size"] == config.vocab_size


def test_moe_experts_quick_writes_its_files(tmp_path):
    """bench.kernels.moe_experts: Rill's packed experts give transformers' grouped GEMM's output."""
    from rill.bench.kernels import moe_experts

    out = tmp_path / "moe_experts-test.json"
    report = moe_experts.main(["--quick", "--out", str(out)])
    assert [(r["family"], r["tokens"]) for r in report["rows"]] == [("qwen3_moe", 16), ("qwen3_moe", 512)]
    assert all(r["max_abs_diff"] <= 1e-2 * r["max_abs"] and r["rill_ms"] > 0 for r in report["rows"])
    assert json.loads(out.read_text())["benchmark"] == "moe_experts" and out.with_suffix(".md").is_file()
