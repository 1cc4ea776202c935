"""bfloat16 linear layers through AMX micro-kernels (csrc/amx_linear.cpp, loader.AmxLinear).

It runs only where the CPU has AMX-BF16 (elsewhere these tests skip and oneDNN's layers serve)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig

from rill.engine_proc.cpu_features import cpu_info
from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.linear import (
    HEAD,
    AmxLinear,
    PackedLinear,
    PanelEmbedding,
    pack_linears_for_cpu,
    packed_linear,
)
from rill.engine_proc.model.llama import LlamaForCausalLM


def supported() -> bool:
    return extension.available() and bool(torch.ops.rill_cpu.amx_linear_supported())


pytestmark = pytest.mark.skipif(not supported(), reason="no AMX-BF16 on this CPU (or no built kernels)")
# The kernels are built for this CPU, not for an older target (tests/model/test_cpu_kernels_portable.py's builds
# for AVX2 and SSE2 CPUs run these tests too, on whatever CPU this is): only then are Rill's micro-kernels there.
NATIVE = (os.environ.get("RILL_CPU_ARCH") or "native") == "native"


def layer(out_features: int, in_features: int, bias: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(out_features, in_features, generator=gen) * in_features**-0.5).to(torch.bfloat16)
    b = torch.randn(out_features, generator=gen).to(torch.bfloat16) if bias else None
    return weight, b


# Shapes of the bundled model, an output width that is not a multiple of 64, and rows that fill
# no tile, one tile, and tiles plus a partial one.
@pytest.mark.parametrize(("out_features", "in_features"), [(960, 576), (576, 1536), (100, 64)])
@pytest.mark.parametrize("rows", [1, 32, 77])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_torch_within_bfloat16_rounding(out_features, in_features, rows, bias):
    weight, b = layer(out_features, in_features, bias)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    got = AmxLinear(weight, b)(x)
    exact = F.linear(x.double(), weight.double(), None if b is None else b.double())
    assert got.dtype == torch.bfloat16 and got.shape == (rows, out_features)
    # float32 accumulation, one rounding to bfloat16: within half a bfloat16 step of the exact sum
    # (plus float32's own error), and no worse than torch's bfloat16 linear.
    err = (got.double() - exact).abs()
    assert (err <= exact.abs() * 2**-8 + 1e-3).all(), err.max().item()
    torch_err = (F.linear(x, weight, b).double() - exact).abs().max()
    assert err.max() <= torch_err * 1.01 + 1e-6


@pytest.mark.parametrize("fixed_tiles", [True, False])
def test_a_row_gets_the_same_bits_whatever_else_is_in_the_call(fixed_tiles):
    """--batch-invariant serves these layers without row tiles (fixed_tiles: a partial tile padded,
    every call the same shape): a row alone, in a partial tile, in a full one or among many must
    give the same bits. Without the padding it holds too on the AMX CPUs tested (AMX computes each
    row alone), which this checks on whatever CPU runs it."""
    weight, b = layer(576, 1536, bias=True)
    amx = AmxLinear(weight, b, fixed_tiles=fixed_tiles)
    x = torch.randn(200, 1536, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    full = amx(x)
    for start, count in [(0, 1), (5, 1), (199, 1), (3, 7), (0, 32), (10, 33), (40, 160)]:
        assert torch.equal(amx(x[start:start + count]), full[start:start + count]), (start, count)


def test_three_dimensional_inputs_keep_their_shape():
    weight, _ = layer(128, 64, bias=False)
    x = torch.randn(2, 5, 64).to(torch.bfloat16)
    assert torch.equal(AmxLinear(weight, None)(x), AmxLinear(weight, None)(x.reshape(10, 64)).view(2, 5, 128))


def test_which_layers_get_the_amx_kernel():
    weight, _ = layer(128, 64, bias=False)
    for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "q_proj", "up_proj", "lm_head"):
        chosen = type(packed_linear(weight, None, name, batch_invariant=False))
        assert chosen is (PackedLinear if name == HEAD else AmxLinear), name
        assert type(packed_linear(weight, None, name, batch_invariant=False, tied=True)) is AmxLinear  # PanelEmbedding
        invariant = packed_linear(weight, None, name, batch_invariant=True)
        assert type(invariant) is AmxLinear and invariant.fixed_tiles and invariant.row_invariant  # invariant as built
    assert type(packed_linear(weight.float(), None, "o_proj", batch_invariant=True)) is PackedLinear
    assert not AmxLinear(weight, None).row_invariant  # tile_linears would tile it


@pytest.mark.parametrize("rows", [1, 32, 77, 512])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("fixed_tiles", [False, True])
def test_the_fused_silu_mul_gives_the_bits_of_the_layer_then_silu_mul(rows, bias, fixed_tiles):
    """The gate_up projection with SiLU(gate) * up in its epilogue: the same bits as the layer's
    bfloat16 output fed to the separate silu_mul, and within bfloat16 rounding of the exact."""
    weight, b = layer(2 * 192, 576, bias)
    amx = AmxLinear(weight, b, fixed_tiles=fixed_tiles)
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    assert amx.fuses_silu_mul
    got = amx.silu_mul(x)
    assert got.shape == (rows, 192)
    assert torch.equal(got, torch.ops.rill_cpu.silu_mul(amx(x)))
    gate, up = F.linear(x.double(), weight.double(), None if b is None else b.double()).split(192, dim=-1)
    exact = F.silu(gate) * up
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-6 + 2e-2).all()
    if rows > 1:  # a row's bits do not depend on the others in the call
        assert torch.equal(amx.silu_mul(x[rows // 2:rows // 2 + 1]), got[rows // 2:rows // 2 + 1])


def test_silu_mul_needs_whole_panels_of_gate_and_up():
    weight, _ = layer(2 * 96, 64, bias=False)  # 96 columns each: gate's last panel would hold up's first
    amx = AmxLinear(weight, None)
    assert not amx.fuses_silu_mul
    with pytest.raises(RuntimeError, match="multiple of 128"):
        amx.silu_mul(torch.randn(4, 64).to(torch.bfloat16))


@pytest.mark.parametrize("rows", [1, 32, 77])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("fixed_tiles", [False, True])
def test_the_fused_rope_gives_the_bits_of_the_layer_then_rope(rows, bias, fixed_tiles):
    """qkv_proj with its q and k heads (of 64) rotated in the epilogue: the bits of the layer's
    output rotated in place by rope_, v's heads untouched."""
    weight, b = layer(15 * 64, 576, bias)
    amx = AmxLinear(weight, b, fixed_tiles=fixed_tiles)
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    angles = (torch.arange(rows, dtype=torch.float32)[:, None] + 3) * torch.rand(32, generator=torch.Generator().manual_seed(5))
    cos, sin = angles.cos().to(torch.bfloat16)[:, None], angles.sin().to(torch.bfloat16)[:, None]
    expected = amx(x).view(rows, 15, 64)
    plain = expected.clone()
    torch.ops.rill_cpu.rope_(expected, cos, sin, 12)
    got = amx.rope(x, cos, sin, 12).view(rows, 15, 64)
    assert torch.equal(got, expected)
    assert torch.equal(got[:, 12:], plain[:, 12:]) and not torch.equal(got[:, :12], plain[:, :12])


@pytest.mark.parametrize("vocab", [64, 100, 250])  # whole panels, one part panel, several and a part
def test_a_panel_embedding_reads_the_weights_rows(vocab):
    weight, _ = layer(vocab, 96, bias=False)
    embedding = torch.nn.Embedding(vocab, 96, _weight=weight)
    lookup = PanelEmbedding(AmxLinear(weight, None), embedding)
    ids = torch.tensor([[0, vocab - 1, 63 % vocab, 5], [vocab // 2, 1, vocab - 1, 0]])
    assert torch.equal(lookup(ids), weight[ids])
    assert torch.equal(lookup(ids[0]), weight[ids[0]])


def test_a_tied_model_keeps_one_copy_of_its_embedding():
    config = LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).to_empty(device="cpu")
    model.init_dummy_weights()
    embedding = model.embed_tokens.weight.clone()
    pack_linears_for_cpu(model)
    assert isinstance(model.lm_head, AmxLinear) and isinstance(model.embed_tokens, PanelEmbedding)
    assert not any(p.shape == embedding.shape for p in model.parameters())  # the float embedding is gone
    ids = torch.arange(config.vocab_size)
    assert torch.equal(model.embed_tokens(ids), embedding)
    x = torch.randn(3, config.hidden_size).to(torch.bfloat16)
    torch.testing.assert_close(model.lm_logits(x).float(), F.linear(x, embedding).float(), rtol=2e-2, atol=2e-2)


# Where the build has AMX, amx_tiles.h's kernel serves every K that is a multiple of 32, and takes K in
# chunks where a thread's prompt rows outgrow its L2 (8,960 inputs at 512 rows); 48 inputs take brgemm.
@pytest.mark.parametrize(("out_features", "in_features", "rows"),
                         [(1536, 8960, 512), (256, 4096, 300), (130, 48, 200), (64, 8960, 33)])
def test_long_rows_in_chunks_keep_each_rows_bits_and_the_exact_sum(out_features, in_features, rows):
    weight, b = layer(out_features, in_features, bias=True)
    amx = AmxLinear(weight, b)
    x = torch.randn(rows, in_features, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    got = amx(x)
    exact = F.linear(x.double(), weight.double(), b.double())
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-3).all()
    for start, count in [(0, 1), (rows - 1, 1), (5, 32), (1, rows - 2)]:
        assert torch.equal(amx(x[start:start + count]), got[start:start + count]), (start, count)


@pytest.mark.parametrize("rows", [1, 512])
def test_a_chunked_gate_up_with_silu_gives_the_bits_of_the_layer_then_silu_mul(rows):
    weight, b = layer(2 * 192, 8960, bias=True)
    amx = AmxLinear(weight, b)
    x = torch.randn(rows, 8960, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    assert torch.equal(amx.silu_mul(x), torch.ops.rill_cpu.silu_mul(amx(x)))


_BITS_SCRIPT = """
import sys, torch
from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.linear import AmxLinear
assert extension.available()
gen = torch.Generator().manual_seed(0)
out = []
for n, k, rows in [(2048, 1536, 1), (2048, 1536, 32), (1536, 8960, 512), (384, 1536, 77)]:
    w = (torch.randn(n, k, generator=gen) * k**-0.5).to(torch.bfloat16)
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    layer = AmxLinear(w, torch.randn(n, generator=gen).to(torch.bfloat16))
    out += [layer(x), layer.silu_mul(x), AmxLinear(w, None, fixed_tiles=True)(x)]
torch.save(out, sys.argv[1])
"""


@pytest.mark.skipif(not cpu_info().has("amx_bf16"), reason="amx_tiles.h's kernel is built only for a CPU with AMX")
def test_the_tiles_kernel_gives_brgemms_bits(tmp_path):
    """RILL_AMX_TILES=0 with RILL_BF16_DOT=0 keeps ATen's brgemm: the two paths give the same bits, decode rows, prompt rows
    (K in chunks too), the SiLU epilogue and --batch-invariant's fixed tiles."""
    results = []
    for flag in ("1", "0"):
        path = tmp_path / f"tiles{flag}.pt"
        subprocess.run([sys.executable, "-c", _BITS_SCRIPT, str(path)], check=True, timeout=300,
                       env={**os.environ, "RILL_AMX_TILES": flag, "RILL_BF16_DOT": "0"})
        results.append(torch.load(path))
    assert len(results[0]) == 12
    for with_tiles, with_brgemm in zip(*results):
        assert torch.equal(with_tiles, with_brgemm)


@pytest.mark.skipif(not (NATIVE and cpu_info().has("avx512_bf16")),
                    reason="bf16_dot_panel.h's kernel is built only for a CPU with AVX-512 BF16")
def test_the_avx512_kernel_gives_brgemms_bits(tmp_path):
    """Where the tiles are not (RILL_AMX_TILES=0 here; a Zen 4), Rill's AVX-512 BF16 kernel serves, and
    RILL_BF16_DOT=0 keeps ATen's brgemm: the same bits, decode and prompt rows (K in chunks too), the SiLU
    epilogue and fixed tiles. oneDNN is held to AVX-512 BF16 as well, which on an AMX CPU it would not be."""
    results = []
    for flag in ("1", "0"):
        path = tmp_path / f"dot{flag}.pt"
        subprocess.run([sys.executable, "-c", _BITS_SCRIPT, str(path)], check=True, timeout=300,
                       env={**os.environ, "RILL_AMX_TILES": "0", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
                            "RILL_BF16_DOT": flag})
        results.append(torch.load(path))
    assert len(results[0]) == 12
    for with_dot, with_brgemm in zip(*results):
        assert torch.equal(with_dot, with_brgemm)


def test_the_kernel_in_use_is_named():
    expected = ("brgemm" if not NATIVE
                else "amx_tiles" if cpu_info().has("amx_bf16") and os.environ.get("RILL_AMX_TILES") != "0"
                else "avx512_bf16" if cpu_info().has("avx512_bf16") and os.environ.get("RILL_BF16_DOT") != "0"
                else "brgemm")
    assert torch.ops.rill_cpu.amx_linear_kernel() == expected


@pytest.mark.parametrize("fused", ["none", "silu_mul", "rope"])
def test_a_step_past_512_rows_runs_in_blocks_with_the_same_bits(fused):
    """More than 512 rows (a 2,048-token prompt step) run as blocks of 512: every row's bits as alone, the
    SiLU and RoPE epilogues included (RoPE's cos and sin follow the block's rows)."""
    weight, b = layer(4 * 64, 576, bias=True)
    amx = AmxLinear(weight, b)
    rows = 1100
    x = torch.randn(rows, 576, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    angles = (torch.arange(rows, dtype=torch.float32)[:, None] + 1) * torch.rand(32, generator=torch.Generator().manual_seed(9))
    cos, sin = angles.cos().to(torch.bfloat16)[:, None], angles.sin().to(torch.bfloat16)[:, None]
    run = {"none": lambda s: amx(x[s]), "silu_mul": lambda s: amx.silu_mul(x[s]),
           "rope": lambda s: amx.rope(x[s], cos[s], sin[s], 2)}[fused]
    full = run(slice(0, rows))
    for start, count in [(0, 1), (511, 2), (700, 1), (rows - 1, 1), (520, 580)]:
        assert torch.equal(run(slice(start, start + count)), full[start:start + count]), (start, count)
