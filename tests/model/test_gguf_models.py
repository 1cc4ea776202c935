"""`--model FILE.gguf` (engine_proc/model/gguf_dir.py): GGUF files the tests write themselves
(tests/helpers/gguf_files.py), converted once into a Hugging Face directory."""
from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rill.engine_proc.model import gguf_dir
from tests.helpers.gguf_files import gguf_tensors, llama_cpp_permute, tiny_model, write_gguf

Q = gguf.GGMLQuantizationType
IDS = torch.tensor([[1, 504, 3325, 314, 253, 1200, 30, 2]])


QUANTIZED = {Q.Q4_0: 0.12}  # the type and its weights' relative error bound (Q8_0: the served test's)


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def converted(model, tmp_path_factory):
    """type -> (the GGUF file, its cache folder, the converted directory), each converted once."""
    folder = tmp_path_factory.mktemp("gguf")
    out = {}
    for quantization in QUANTIZED:
        path = write_gguf(model, folder / f"tiny.{quantization.name}.gguf", quantization)
        out[quantization] = (path, folder / "cache", gguf_dir.ensure_gguf_model(path, folder / "cache"))
    return out


def test_a_float32_gguf_gives_back_the_models_logits_and_tokenizer(tmp_path):
    """A Qwen3 (no q/k permutation, its q and k norms) rather than a Llama: the served test's Q8_0
    file is a Llama. tests/helpers/gguf_files.py writes both."""
    model = tiny_model("qwen3")
    path = write_gguf(model, tmp_path / "tiny.F32.gguf")
    converted = gguf_dir.ensure_gguf_model(path, tmp_path / "cache")
    assert converted.parent == tmp_path / "cache" / "gguf" and converted.name.startswith("tiny.F32-")
    with torch.inference_mode():
        again = AutoModelForCausalLM.from_pretrained(converted).eval()
        torch.testing.assert_close(again(IDS).logits, model(IDS).logits, atol=1e-5, rtol=1e-5)
    from tokenizers import Tokenizer

    from rill.engine_proc.model.bundled import ensure_bundled_model

    text = "The GGUF's own tokenizer, with its merges: naïve café 42!"
    tokenizer, bundled = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (converted, ensure_bundled_model()))
    assert tokenizer.encode(text).ids == bundled.encode(text).ids
    assert "{% for message in messages %}" in (converted / "tokenizer_config.json").read_text()  # the chat template


@pytest.mark.parametrize("quantization", list(QUANTIZED))
def test_quantized_weights_are_the_files_own(model, converted, quantization):
    """Each converted weight is the file's blocks dequantized (by the gguf package, independently of
    transformers' loader), q and k back in transformers' row order; within the type's error."""
    bound = QUANTIZED[quantization]
    converted = AutoModelForCausalLM.from_pretrained(converted[quantization][2])
    original = gguf_tensors(model)
    # The file's blocks are these (write_gguf quantizes the same arrays the same way).
    stored = {name: gguf.quants.dequantize(gguf.quants.quantize(array, quantization), quantization)
              for name, array in original.items() if array.ndim == 2}
    layer = converted.model.layers[1]
    pairs = {"blk.1.ffn_down.weight": layer.mlp.down_proj.weight, "blk.1.attn_v.weight": layer.self_attn.v_proj.weight,
             "token_embd.weight": converted.model.embed_tokens.weight, "output.weight": converted.lm_head.weight}
    for name, weight in pairs.items():
        np.testing.assert_array_equal(weight.detach().numpy(), stored[name].reshape(weight.shape))
    # q's rows: llama.cpp's order in the file, transformers' after the conversion
    q = layer.self_attn.q_proj.weight.detach().numpy()
    np.testing.assert_array_equal(llama_cpp_permute(q, model.config.num_attention_heads), stored["blk.1.attn_q.weight"])
    for name in ("blk.1.ffn_down.weight", "blk.1.attn_q.weight"):
        error = np.linalg.norm(stored[name] - original[name]) / np.linalg.norm(original[name])
        assert 0 < error < bound, (name, error)


def test_a_file_converts_once_and_again_when_it_changes(converted):
    path, cache, first = converted[Q.Q4_0]
    weights = first / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert gguf_dir.ensure_gguf_model(path, cache) == first and weights.stat().st_mtime_ns == written
    os.utime(path, ns=(written + 10**9, written + 10**9))  # a new file at the same path
    second = gguf_dir.ensure_gguf_model(path, cache)
    assert second != first and gguf_dir.is_complete(second)


def test_a_split_file_converts_from_its_first_part(model, converted, tmp_path):
    """llama.cpp's split files (here 7 tensors a part, as its convert script writes them): the first part names
    the model, and the converted weights are the one file's; another part, or a missing one, is an error that
    says which to pass or which is missing."""
    first = write_gguf(model, tmp_path / "tiny.Q4_0.gguf", Q.Q4_0, split_max_tensors=7)
    parts = sorted(tmp_path.glob("tiny.Q4_0-*-of-*.gguf"))
    assert first == parts[0] and len(parts) == 3 and first.name == "tiny.Q4_0-00001-of-00003.gguf"
    split = AutoModelForCausalLM.from_pretrained(gguf_dir.ensure_gguf_model(first, tmp_path / "cache"))
    whole = AutoModelForCausalLM.from_pretrained(converted[Q.Q4_0][2])
    for (name, a), (_, b) in zip(split.state_dict().items(), whole.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0, msg=name)
    with pytest.raises(ValueError, match="pass its first part, tiny.Q4_0-00001-of-00003.gguf"):
        gguf_dir.ensure_gguf_model(parts[1], tmp_path / "cache")
    parts[2].unlink()
    with pytest.raises(ValueError, match="tiny.Q4_0-00003-of-00003.gguf not found"):
        gguf_dir.ensure_gguf_model(first, tmp_path / "cache2")
