"""`bench.peers --shape`: the GGUF written for llama.cpp at a config's shape, the bandwidth floor's bytes,
the memory figures, and a quick run at a tiny shape end to end."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import numpy as np
import pytest

from rill.bench.kernels.dummy_model_dir import make_dir
from rill.bench.peers import shape, shape_gguf
from rill.bench.serving.servers import ROOT

TINY = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 49152 + 64,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}


@pytest.fixture
def tiny_dir(tmp_path):
    path = tmp_path / "tiny-qwen2-shape"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(TINY))
    return path


def test_the_gguf_has_the_configs_shape_in_q4_0_and_the_served_sides_vocabulary(tiny_dir, model_dir, tmp_path):
    reader = gguf.GGUFReader(shape_gguf.write(tiny_dir, tmp_path / "tiny.gguf"))
    assert reader.fields["general.architecture"].contents() == "qwen2"
    assert reader.fields["qwen2.block_count"].contents() == 2
    kinds = {t.name: t.tensor_type for t in reader.tensors}
    assert kinds["token_embd.weight"] == gguf.GGMLQuantizationType.Q8_0 and "output.weight" not in kinds  # tied
    assert kinds["blk.1.ffn_down.weight"] == kinds["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q4_0
    assert kinds["blk.0.attn_q.bias"] == kinds["output_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert len(kinds) == 2 + 2 * (7 + 3 + 2)  # embedding, final norm; per layer 7 weights, 3 biases, 2 norms
    down = next(t for t in reader.tensors if t.name == "blk.1.ffn_down.weight")
    values = gguf.quants.dequantize(down.data, down.tensor_type)
    assert values.shape == (64, 128)  # (out, in), as llama.cpp reads a [in, out] ggml tensor
    assert set(np.unique(np.round(values / shape_gguf.SCALES[down.tensor_type]))) <= set(range(-8, 8))
    assert 0.01 < values.std() < 0.04
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == TINY["vocab_size"] and tokens[-1] == f"<|pad_{TINY['vocab_size'] - 1}|>"
    served = json.loads((make_dir(tiny_dir, tmp_path / "served", model_dir) / "tokenizer.json").read_text())
    assert served["model"]["vocab"][tokens[-1]] == TINY["vocab_size"] - 1
    assert served["model"]["vocab"][tokens[1000]] == 1000


def test_int4_decode_bytes_are_the_4bit_layers_and_the_int8_head():
    layer_params = 2 * (64 * (4 + 2 + 2) * 16 + 64 * 64 + 3 * 64 * 128)
    head_params = TINY["vocab_size"] * 64
    got = shape.int4_decode_bytes(TINY)
    assert 0.5 * layer_params + head_params < got < 0.75 * layer_params + 1.1 * head_params
    # symmetric (the side's flags, as the Q4_0 file): 4.5 bits a weight, the offsets' half bit less than asymmetric's
    assert shape.int4_decode_bytes(TINY, symmetric=False) - got == layer_params // 32 * 2


def test_bf16_decode_bytes_read_a_tied_head_once_and_an_untied_one_in_the_embeddings_place():
    tied = shape.bf16_decode_bytes(TINY)
    assert tied == 2 * shape.num_parameters(TINY)
    assert shape.bf16_decode_bytes({**TINY, "tie_word_embeddings": False}) == tied


def test_the_itl_goal_against_vllm_is_said_out_of_reach_below_the_bf16_floor():
    report = {"name": "x", "num_parameters": 1e9, "gguf": None, "copy_bandwidth_gb_s": 28.0, "int4_decode_bytes": 1e9,
              "int4_floor_ms": 35.7, "read_bandwidth_gb_s": 33.0, "bf16_decode_bytes": 3.1e9, "bf16_floor_ms": 94.0,
              "memory": {}, "startup_s": {}}
    fast_vllm = "\n".join(shape.markdown(report, None, {"rill": 102.0, "vllm": 120.0}))
    assert "Rill's ITL at concurrency 1 is 1.09x and vLLM's 1.28x" in fast_vllm and "0.89x (below the floor" in fast_vllm
    slow_vllm = "\n".join(shape.markdown(report, None, {"rill": 102.0, "vllm": 170.0}))
    assert "asks Rill for 1.27x" in slow_vllm and "below the floor" not in slow_vllm


def test_tree_rss_counts_the_children():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time; b = bytearray(300 << 20); "
                              "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        assert shape.tree_rss(child.pid) > 300 << 20
        assert shape.tree_rss(os.getpid()) > shape.tree_rss(child.pid) + (50 << 20)  # and this process
    finally:
        child.kill()
        child.wait()


def test_quick_run_at_a_tiny_shape(tiny_dir, model_dir, tmp_path):
    out = tmp_path / "peers.json"
    proc = subprocess.run([sys.executable, "-m", "rill.bench.peers", "--quick", "--peers", "rill,rill_int4",
                           "--shape", str(tiny_dir), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    at = report["shape"]
    assert "--load-format" in report["params"]["rill_flags"] and at["gguf"] is None
    assert at["num_parameters"] == TINY["vocab_size"] * 64 + 2 * (64 * 8 * 16 + 8 * 16 + 64 * 64 + 3 * 64 * 128
                                                                  + 2 * 64) + 64
    assert at["int4_floor_ms"] == pytest.approx(at["int4_decode_bytes"] / (at["copy_bandwidth_gb_s"] * 1e9) * 1e3)
    assert at["bf16_floor_ms"] == pytest.approx(at["bf16_decode_bytes"] / (at["read_bandwidth_gb_s"] * 1e9) * 1e3)
    assert at["bf16_decode_bytes"] == 2 * at["num_parameters"]  # tied: the head is the embedding
    for side in ("rill", "rill_int4"):
        memory = at["memory"][side]
        assert memory["tree_rss_bytes"] >= memory["rss_bytes"] > memory["weight_bytes"] > 0, side
        assert memory["kv_cache_bytes"] > 0 and at["startup_s"][side] > 0
    # 4-bit layers and an int8 head hold less than the bfloat16 model. The bfloat16 model's tied head serves its
    # embedding too (PanelEmbedding); int4 keeps a bfloat16 embedding for the lookups beside its int8 head.
    embedding_bytes = TINY["vocab_size"] * 64 * 2
    assert at["memory"]["rill_int4"]["weight_bytes"] - embedding_bytes < at["memory"]["rill"]["weight_bytes"]
    md = out.with_suffix(".md").read_text()
    assert "## At tiny-qwen2-shape's shape" in md and "x the floor" in md and "a 1 GiB read (torch's sum)" in md
