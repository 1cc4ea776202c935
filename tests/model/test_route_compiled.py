"""The transformers route's compiled decode steps (engine_proc/model/hf_paged.py, decode_graphs.py):
transformers' logits through the graph, with the windows and soft-caps inside it."""
from __future__ import annotations

import pytest

from rill.engine_proc.model import linear_states
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from tests.helpers.runners import make_runner
from tests.helpers.scheduled import BLOCK_SIZE, EOS_ID, hf_continuations, outputs, run_scheduled
from tests.helpers.tiny_models import save_tiny_model


@pytest.mark.parametrize("kind", ["gemma2", "gemma4_text", "qwen3_5_text", "granitemoehybrid", "deepseek_v3"])
def test_compiled_decode_steps_match_transformers(kind, tmp_path, monkeypatch):
    """Decode-only steps through torch.compile (engine_proc/model/decode_graphs.py), as `rill serve`
    runs them: Gemma 2's windows and soft-caps inside the graph; Qwen3.5's Gated DeltaNet and Granite
    4's Mamba 2 states, their pools grown while the graph runs (from 2 slots, the scratch slot's one);
    DeepSeek V3's latent attention. (GPT-OSS's sinks and experts go through the same op and opaque op,
    Qwen3-Next's and Nemotron-H's state layers through Qwen3.5's and Granite 4's decode steps, which the
    zoo checks eagerly; one compile of each family would cost CI about 15 s.)"""
    monkeypatch.setattr(linear_states, "FIRST_SLOTS", 2)
    hf = save_tiny_model(kind, tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], compile_decode=True, max_num_seqs=8)
    assert runner.decode_graphs is not None, "torch.compile failed: see the warning in the log"
    graph_rows, run = [], runner.decode_graphs.run
    runner.decode_graphs.run = lambda batch: graph_rows.append(batch.num_tokens) or run(batch)
    linear = runner.linear_states is not None  # Qwen3.5's linear layers: their states' slots inside the graph
    reqs = run_scheduled(runner, hf, {"a": 0, "b": 0, "c": 3}, caching=not linear)
    assert outputs(reqs) == {k: v for k, v in hf_continuations(hf).items() if k in "abc"}
    assert len(graph_rows) >= 8 and max(graph_rows) == 3  # the decode steps went through the graph
    if linear:
        assert runner.linear_states.capacity == 4
