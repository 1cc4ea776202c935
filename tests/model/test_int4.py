"""--quantization int4: the packing, the C++ kernels against their torch twin, and the runner."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from torch import nn

from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.int4_linear import GEMV_MAX_ROWS, Int4Linear, dequantize_int4, quantize_int4
from rill.engine_proc.kernels.int8_linear import Int8Linear
from rill.engine_proc.model.gguf_int4 import blocks_to_int4
from tests.helpers.generation import generate_logits
from tests.helpers.gguf_files import quantize
from tests.helpers.runners import make_runner
from tests.helpers.tiny_models import save_tiny_model

DTYPES = [torch.float32, torch.bfloat16]
needs_kernels = pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the kernels are not built")


def test_quantize_rounds_each_weight_to_its_groups_grid():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(7, 70, generator=gen) * torch.logspace(-3, 1, 7).unsqueeze(1)  # K: two groups and a part
    weight[3, :32] = 0.25  # a constant group: scale 0
    packed, scales, offsets = quantize_int4(weight)
    # K padded to 128 (whole pairs of groups): a fourth group of zeros.
    assert packed.shape == (7, 64) and packed.dtype == torch.uint8 and scales.shape == offsets.shape == (7, 4)
    got = dequantize_int4(packed, scales, offsets, 70)
    step = scales.float().repeat_interleave(32, dim=1)[:, :70]
    assert ((got - weight).abs() <= step / 2 * 1.001 + 1e-6).all()
    assert torch.equal(got[3, :32], torch.full((32,), float(torch.tensor(0.25).half())))
    # Every group's smallest and largest weight sit on the grid's ends (0 and at most 15).
    q = torch.cat(((packed.view(7, 4, 16) & 15), packed.view(7, 4, 16) >> 4), dim=-1)
    assert int(q.max()) <= 15 and (q[:, :2].amin(-1) == 0).all()


@pytest.mark.parametrize(("group_size", "symmetric"), [(32, True), (128, False), (128, True)])
def test_group_size_and_symmetry_set_the_scales(group_size, symmetric):
    """Groups of 128: a scale (and offset) for four groups of 32, K = 200 padded to 256 for them and for the
    nibbles. Symmetric: no offsets, and each group's weight of largest magnitude on the grid's end (q = 0)."""
    gen = torch.Generator().manual_seed(group_size + symmetric)
    weight = torch.randn(5, 200, generator=gen) * torch.logspace(-2, 1, 5).unsqueeze(1)
    packed, scales, offsets = quantize_int4(weight, group_size, symmetric)
    groups = 2 if group_size == 128 else 8
    assert packed.shape == (5, 128) and scales.shape == (5, groups) and offsets.shape == (5, 0 if symmetric else groups)
    got = dequantize_int4(packed, scales, offsets, 200)
    step = scales.float().abs().repeat_interleave(group_size, dim=1)[:, :200]
    # Half a step, but a whole one past +7 steps (symmetric: as Q4_0, the grid holds 8 below zero and 7 above)
    assert ((got - weight).abs() <= step * (1 if symmetric else 0.5) * 1.001 + 1e-6).all()
    if symmetric:
        padded = torch.nn.functional.pad(weight, (0, 56)).view(5, -1, group_size)
        extreme = padded.gather(-1, padded.abs().argmax(-1, keepdim=True)).squeeze(-1)
        torch.testing.assert_close(-8 * scales.float(), extreme, rtol=2**-10, atol=0)
    assert not torch.equal(got, dequantize_int4(*quantize_int4(weight), 200))  # not the default's grid


def test_packed_nibbles_follow_ggufs_order():
    """Byte j of a group: element j in its low four bits, element 16 + j in its high four (Q4_0, Q4_1)."""
    weight = torch.arange(32, dtype=torch.float32).unsqueeze(0) / 31  # q = round(k * 15 / 31)
    packed, scales, offsets = quantize_int4(weight)
    q = torch.round(torch.arange(32) * 15 / 31).to(torch.uint8)
    assert torch.equal(packed[0, :16], q[:16] | (q[16:] << 4))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
# The GEMV (1, 3 and 8 rows at once; 11: each block of weight rows into 8 of them, then 3, where the GEMV takes 11
# rows), then the converted weight's GEMM. K = 100: four groups, the VNNI kernel's tail octet alone (two rows an
# octet); K = 576 (the bundled model's) and 896: octets, then a tail of 2 or 4 groups (four or two rows an octet,
# the odd row at the end of the 45 on its own); K = 4,000: 126 groups (the last octet holds six), and 16 weight rows a
# block (csrc/simd16.h's row_blocks), so that each thread takes more than one.
@pytest.mark.parametrize("num_rows", [1, 3, 8, 11, GEMV_MAX_ROWS + 5])
@pytest.mark.parametrize("in_features", [100, 576, 896, 4000])
def test_int4_linear_is_the_dequantized_linear(dtype, num_rows, in_features):
    gen = torch.Generator().manual_seed(num_rows)
    weight, bias = torch.randn(45, in_features, generator=gen) / 10, torch.randn(45, generator=gen)  # N odd
    layer = Int4Linear(weight.to(dtype), bias.to(dtype))
    assert layer.uses_kernels
    x = torch.randn(num_rows, in_features, generator=gen).to(dtype)
    weight_q = layer.dequantized_weight(torch.float64)
    want = torch.nn.functional.linear(x.double(), weight_q, bias.to(dtype).double())
    got = layer(x)
    assert got.dtype == dtype
    # Within the rounding of the activations: to int8 per group of 32 in the AVX512-VNNI kernel (half a step
    # of max|x| / 127 each), to bfloat16 for bfloat16's output; and float32's sums.
    padded = torch.nn.functional.pad(x.double().abs(), (0, -in_features % 32)).view(num_rows, -1, 32)
    group_max = padded.amax(-1, keepdim=True).expand_as(padded).reshape(num_rows, -1)[:, :in_features]
    bound = (group_max @ weight_q.abs().T) / 254 + want.abs() * (2**-8 if dtype == torch.bfloat16 else 1e-6)
    assert ((got.double() - want).abs() <= bound + 1e-5).all(), (got.double() - want).abs().max()
    # Within the GEMV, each row's outputs do not depend on the rows beside it.
    gemv_rows = layer.bf16_gemv_rows if dtype == torch.bfloat16 else GEMV_MAX_ROWS
    assert torch.equal(layer(x[-1:]), got[-1:]) or num_rows > gemv_rows


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
# The GEMV at 1 and 11 rows (8, then 3), then above its rows (bfloat16: the AMX tiles or brgemm's panels where the CPU
# has them; float32: the converted weight's GEMM). K = 4,000: scales for groups of 128 spread over 16 groups of 32 a
# load, the last load a part; K = 96: one group of 128, its part past K zero; K = 576: the VNNI kernel's tail octet
# (the last 2 groups of 32 of four rows) takes half a group of 128's scale.
@pytest.mark.parametrize("num_rows", [1, 11, GEMV_MAX_ROWS + 5])
@pytest.mark.parametrize("in_features", [96, 576, 4000])
@pytest.mark.parametrize(("group_size", "symmetric"), [(32, True), (128, False), (128, True)],
                         ids=["sym", "g128", "sym-g128"])
def test_int4_linear_with_other_groups_is_the_dequantized_linear(dtype, num_rows, in_features, group_size, symmetric):
    gen = torch.Generator().manual_seed(num_rows + in_features)
    weight = torch.randn(45, in_features, generator=gen) / 10
    layer = Int4Linear(weight.to(dtype), group_size=group_size, symmetric=symmetric)
    assert_is_its_dequantized_linear(layer, torch.randn(num_rows, in_features, generator=gen).to(dtype))


def assert_is_its_dequantized_linear(layer: Int4Linear, x: torch.Tensor) -> None:
    """layer(x) against x times the dequantized weight, within the activations' rounding to int8 per group of 32 (the
    VNNI and AVX2 GEMVs) or the weights' to bfloat16 (the panels), and bfloat16's output."""
    weight_q = layer.dequantized_weight(torch.float64)
    want = x.double() @ weight_q.T
    got = layer(x)
    bound = (x.double().abs() @ weight_q.abs().T) / 254 + want.abs() * (2**-8 if x.dtype == torch.bfloat16 else 1e-6)
    assert ((got.double() - want).abs() <= bound + 1e-5).all(), (got.double() - want).abs().max()


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_rows", [1, 11, GEMV_MAX_ROWS + 5])
@pytest.mark.parametrize("in_features", [256, 768])
def test_int4_linear_on_q4_k_blocks_is_the_dequantized_linear(dtype, num_rows, in_features):
    """GGUF Q4_K blocks kept two-level (its codes, and d and dmin per 256 weights): 8 groups a super-block, so K = 256
    is one and 768 three (the kernels' last load of 16 groups holds one super-block)."""
    rng = np.random.default_rng(num_rows + in_features)
    weight = rng.normal(size=(45, in_features)).astype(np.float32) / 10
    packed = blocks_to_int4(quantize(weight, gguf.GGMLQuantizationType.Q4_K), gguf.GGMLQuantizationType.Q4_K)
    assert packed[1].dtype == torch.uint8
    layer = Int4Linear(torch.from_numpy(weight).to(dtype), packed=packed)
    x = rng.normal(size=(num_rows, in_features)).astype(np.float32)
    assert_is_its_dequantized_linear(layer, torch.from_numpy(x).to(dtype))


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_gemv_rounding_follows_the_weights_not_their_offsets(dtype):
    """The activations' rounding (to int8 per group in the VNNI kernel) weighs in by w, as llama.cpp's Q4_1 x
    Q8_1 does: a group of weights at 0 with one at -1 (offset -1) against activations 127 and 0.5 (which round
    to 0) gives -127. Rounding only the scales' part left (w - offset) = 1 on each 0.5: -142.5."""
    weight = torch.zeros(16, 32)
    weight[:, 0] = -1.0
    layer = Int4Linear(weight.to(dtype))
    x = torch.full((1, 32), 0.5)
    x[0, 0] = 127.0
    got = layer(x.to(dtype)).float()
    want = torch.nn.functional.linear(x.double(), layer.dequantized_weight(torch.float64)).float()
    assert abs(float(want[0, 0]) + 127) < 0.1
    torch.testing.assert_close(got, want, rtol=2**-8, atol=0.05)


# Rows: a part of a tile of 32 (one and two of AMX's 16-row tiles), a tile and one row more, several tiles, and
# more than the tiles' 512 rows a call (csrc/quant_tiles.h's kPromptRows).
@pytest.mark.parametrize("num_rows", [1, 17, 33, 70, 515])
@pytest.mark.parametrize("scheme", [(32, False), (128, True)], ids=["g32", "sym-g128"])
def test_int4_panels_are_the_dequantized_linear(num_rows, scheme, panels_kernel):
    """150 outputs: two whole 64-column panels and a part (22: one block of 16 rows, and 6 of the next), or four
    blocks of 32 rows and a part for the tiles; K = 96: three groups, the packed rows padded to four; symmetric groups
    of 128: one scale a row."""
    gen = torch.Generator().manual_seed(num_rows)
    layer = Int4Linear(torch.randn(150, 96, generator=gen).to(torch.bfloat16) / 10, group_size=scheme[0],
                       symmetric=scheme[1])
    x = torch.randn(num_rows, 96, generator=gen).to(torch.bfloat16)
    got = torch.ops.rill_cpu.int4_linear(x, layer.nibbles, layer.scales, layer.offsets, 96, 0, 1 << 21)
    weight_q = layer.dequantized_weight(torch.float64)
    want = x.double() @ weight_q.T
    # The weights rounded to bfloat16 (half a step: 2^-9 relative), float32 sums, the output to bfloat16.
    bound = (x.double().abs() @ weight_q.abs().T) * 2**-8 + want.abs() * 2**-8 + 1e-5
    assert got.dtype == torch.bfloat16 and got.shape == (num_rows, 150)
    assert ((got.double() - want).abs() <= bound).all(), (got.double() - want).abs().max()
    assert torch.equal(layer(x), got) or num_rows <= 12  # the layer takes them above the GEMV's rows
    if panels_kernel == "amx_tiles":  # the same tile products in the same order as brgemm's over the panels
        torch.ops.rill_cpu.quant_panels_kernel("brgemm")
        assert torch.equal(torch.ops.rill_cpu.int4_linear(x, layer.nibbles, layer.scales, layer.offsets, 96, 0, 1 << 21),
                           got)


@needs_kernels
@pytest.mark.parametrize("dtype", DTYPES)
def test_int4_dequant_gives_the_twins_weight(dtype):
    gen = torch.Generator().manual_seed(3)
    packed, scales, offsets = quantize_int4(torch.randn(9, 80, generator=gen))
    got = torch.ops.rill_cpu.int4_dequant(packed, scales, offsets, 80, 2, 5, torch.empty(0, dtype=dtype))
    want = dequantize_int4(packed, scales, offsets, 80)[2:7]
    torch.testing.assert_close(got.float(), want, atol=1e-6 if dtype == torch.float32 else 1e-2,
                               rtol=0 if dtype == torch.float32 else 8e-3)


@needs_kernels
def test_int4_linear_traces_whole_under_torch_compile():
    gen = torch.Generator().manual_seed(4)
    layer = Int4Linear(torch.randn(16, 64, generator=gen))
    graphs = []
    compiled = torch.compile(layer, backend=lambda gm, _: graphs.append(gm) or gm, fullgraph=True)
    x = torch.randn(2, 64, generator=gen)
    torch.testing.assert_close(compiled(x), layer(x))
    assert any("rill_cpu.int4_linear" in str(n.target) for n in graphs[0].graph.nodes), graphs[0].graph


def test_int4_runner_stays_close_to_the_float_runner(model_dir, prompts):
    """The bundled model (SmolLM2-135M) in 4 bits: its first token's distribution moves a little."""
    reference = make_runner(model_dir, num_kv_blocks=48, eos_token_ids=[2])
    int4 = make_runner(model_dir, num_kv_blocks=48, eos_token_ids=[2], quantization="int4")
    assert sum(isinstance(m, Int4Linear) for m in int4.model.modules()) == 4 * 30
    assert isinstance(int4.model.lm_head, Int8Linear)  # the head in 8 bits, as llama.cpp's 4-bit files keep it
    assert not any(type(m) is nn.Linear for m in int4.model.modules())
    logits = [generate_logits(r, prompts).float() for r in (reference, int4)]
    probs = [lg.softmax(-1) for lg in logits]
    kl = (probs[0] * (probs[0].clamp_min(1e-12).log() - probs[1].clamp_min(1e-12).log())).sum(-1)
    assert kl.max() < 0.1, kl  # 0.014-0.036 measured on a Zen 4 (int8: under 0.05)


@pytest.mark.parametrize(("group_size", "symmetric"), [(128, True), (32, True)])
def test_int4_options_reach_every_linear_of_a_float_checkpoint(tmp_path, group_size, symmetric):
    """A safetensors model (a tiny Qwen2: q, k and v biases) under --int4-group-size and --int4-symmetric: each linear in that layout,
    the head int8, and the logits those dequantized weights give."""
    save_tiny_model("qwen2", tmp_path)
    runner = make_runner(tmp_path, num_kv_blocks=16, eos_token_ids=[2], quantization="int4",
                         int4_group_size=group_size, int4_symmetric=symmetric)
    layers = [m for m in runner.model.modules() if isinstance(m, Int4Linear)]
    assert layers and isinstance(runner.model.lm_head, Int8Linear)
    for layer in layers:
        kp = layer.nibbles.shape[1] * 2
        assert layer.scales.shape[1] == -(-kp // group_size) and layer.offsets.shape[1] == 0
    prompt = [[5, 9, 13, 2, 7]]
    got = generate_logits(runner, prompt)
    for layer in layers:  # the same weights as plain linears: the kernels' twin
        layer.uses_kernels = False
    torch.testing.assert_close(got, generate_logits(runner, prompt), rtol=0.02, atol=0.02)


def test_int4_is_refused_on_a_gpu(model_dir):
    with pytest.raises(ValueError, match="CPU-only"):
        make_runner(model_dir, num_kv_blocks=4, eos_token_ids=[2], device="cuda", quantization="int4")
