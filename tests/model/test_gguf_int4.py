"""--quantization int4 on a GGUF: its Q4_0, Q4_1 and Q4_K blocks kept as they are (engine_proc/model/gguf_int4.py),
on blocks and on files the tests write themselves (tests/helpers/gguf_files.py)."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from rill.engine_proc.kernels.int4_linear import Int4Linear, dequantize_int4, quantize_int4
from rill.engine_proc.kernels.int8_linear import Int8Linear
from rill.engine_proc.model import gguf_dir
from rill.engine_proc.model.gguf_int4 import blocks_to_int4, fused, llama_cpp_order, repacked_linears
from rill.engine_proc.model.llama import LlamaForCausalLM
from rill.engine_proc.model.loader import iter_safetensors, load_config, load_model, safetensors_files
from tests.helpers.gguf_files import llama_cpp_permute, quantize, tiny_model, write_gguf

Q = gguf.GGMLQuantizationType


@pytest.mark.parametrize(("qtype", "cols"), [(Q.Q4_0, 96), (Q.Q4_1, 96), (Q.Q4_0, 256), (Q.Q4_K, 512)])
def test_blocks_repack_to_the_weights_the_gguf_package_reads(qtype, cols):
    """Exactly: Q4_0 and Q4_1 (an odd number of blocks gets a zero one after it) and Q4_K (two-level: its codes and
    its super-blocks' d and dmin as they are)."""
    weights = np.random.default_rng(cols).normal(size=(6, cols)).astype(np.float32) / 10
    blocks = quantize(weights, qtype)
    want = torch.from_numpy(gguf.quants.dequantize(blocks, qtype).reshape(6, cols))
    nibbles, scales, offsets = blocks_to_int4(blocks, qtype)
    groups = cols // 32 + cols // 32 % 2
    assert nibbles.shape == (6, groups * 16) and offsets.shape == (6, 0 if qtype == Q.Q4_0 else groups)
    assert scales.shape == (6, groups + groups // 2 if qtype == Q.Q4_K else groups)  # Q4_K: codes, then d and dmin
    assert scales.dtype == (torch.uint8 if qtype == Q.Q4_K else torch.float16)
    assert torch.equal(dequantize_int4(nibbles, scales, offsets, cols), want)
    assert blocks_to_int4(gguf.quants.quantize(weights, Q.Q8_0), Q.Q8_0) is None  # not 4-bit: quantized from floats


def test_a_symmetric_part_fused_with_an_asymmetric_one_takes_offsets():
    """A fused linear (q, k and v) of a Q4_0 part and a Q4_1 one: the Q4_0 part's offsets written out, -8 * scale."""
    weights = np.random.default_rng(1).normal(size=(2, 4, 64)).astype(np.float32)
    parts = [blocks_to_int4(quantize(w, qtype), qtype) for w, qtype in zip(weights, (Q.Q4_0, Q.Q4_1))]
    assert parts[0][2].shape == (4, 0) and parts[1][2].shape == (4, 2)
    packed = fused(parts)
    assert packed[2].shape == (8, 2)
    assert torch.equal(dequantize_int4(*packed, 64), torch.cat([dequantize_int4(*p, 64) for p in parts]))
    assert fused([parts[0], parts[0]])[2].shape == (8, 0)  # all symmetric: still none


def test_llama_cpp_order_undoes_the_permutation():
    rows = torch.arange(24.0).view(24, 1)
    permuted = torch.from_numpy(llama_cpp_permute(rows.numpy(), 3))
    assert torch.equal(permuted[torch.argsort(llama_cpp_order(24, 3))], rows)


@pytest.fixture(scope="module", params=[("llama", Q.Q4_0), ("qwen3", Q.Q4_K)], ids=["llama-Q4_0", "qwen3-Q4_K"])
def gguf_model(request, tmp_path_factory):
    """(the file, its converted directory, its 4-bit type)."""
    family, qtype = request.param
    folder = tmp_path_factory.mktemp(f"gguf-int4-{family}")
    path = write_gguf(tiny_model(family), folder / f"tiny.{qtype.name}.gguf", qtype)
    return path, gguf_dir.ensure_gguf_model(path, folder / "cache"), qtype


def test_a_converted_gguf_names_its_file(gguf_model):
    path, converted, _ = gguf_model
    assert gguf_dir.source_gguf(converted) == path.resolve()


def test_int4_keeps_every_4_bit_linear_of_the_file(gguf_model):
    """Every projection an Int4Linear holding the file's blocks: the very weights the conversion dequantized
    (a Llama's q and k rows back in transformers' order), where quantizing those again would move them."""
    _, converted, qtype = gguf_model
    config = load_config(converted)
    floats = float_model(converted)
    model = load_model(converted, config, quantization="int4")
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, Int4Linear)]
    assert len(layers) == 4 * config.num_hidden_layers
    for name, layer in layers:
        want = floats.get_submodule(name).weight
        assert torch.equal(layer.dequantized_weight(), want), name
        assert layer.offsets.shape[1] == (0 if qtype == Q.Q4_0 else layer.nibbles.shape[1] // 16)
        assert not torch.equal(dequantize_int4(*quantize_int4(want), want.shape[1]), want)


def test_a_weight_that_differs_from_the_file_is_quantized_from_floats(gguf_model):
    path, converted, _ = gguf_model
    model = float_model(converted)
    before, wider = repacked_linears(model, path)
    assert not wider and set(before) == {name for name, m in model.named_modules() if type(m) is nn.Linear and name != "lm_head"}
    with torch.no_grad():
        model.layers[1].mlp.down_proj.weight.mul_(1.5)  # as Granite's multipliers are folded in
    after, _ = repacked_linears(model, path)
    assert set(before) - set(after) == {"layers.1.mlp.down_proj"}


def test_a_4_bit_files_wider_layers_are_int8(tmp_path):
    """As a Q4_K_M file holds attn_v and some ffn_down in Q6_K (Q8_0 and Q5_1 here: the gguf package writes those): such a layer (a fused one with such a part) is
    int8, the others keep their blocks; a file with no 4-bit layers is int4, as asked."""
    model = tiny_model("llama")
    path = write_gguf(model, tmp_path / "mixed.gguf", Q.Q4_0,
                      types={"blk.0.attn_v.weight": Q.Q8_0, "blk.1.ffn_down.weight": Q.Q5_1})
    converted = gguf_dir.ensure_gguf_model(path, tmp_path / "cache")
    loaded = load_model(converted, load_config(converted), quantization="int4")
    int8 = {name for name, m in loaded.named_modules() if isinstance(m, Int8Linear)}
    assert int8 == {"layers.0.attn.qkv_proj", "layers.1.mlp.down_proj", "lm_head"}
    assert loaded.layers[0].mlp.down_proj.offsets.numel() == 0  # Q4_0: symmetric
    wide = write_gguf(model, tmp_path / "wide.gguf", Q.Q8_0)
    converted = gguf_dir.ensure_gguf_model(wide, tmp_path / "cache")
    loaded = load_model(converted, load_config(converted), quantization="int4")
    assert {name for name, m in loaded.named_modules() if isinstance(m, Int8Linear)} == {"lm_head"}


def float_model(model_dir) -> LlamaForCausalLM:
    """The native model with the conversion's float32 weights, its linears as loaded (nn.Linear)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(load_config(model_dir))
    model = model.to_empty(device="cpu")
    model.load_weights(iter_safetensors(safetensors_files(model_dir)))
    return model.requires_grad_(False)
