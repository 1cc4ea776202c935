"""--quantization int8: the int8 linear against a float one, the swap, the runner, the flag, the benchmarks."""
from __future__ import annotations

import argparse
import json
import math
import shutil

import pytest
import torch
from torch import nn
from transformers import AutoTokenizer, LlamaConfig

from rill.bench.kernels import quant_linears, quant_quality
from rill.cli import main as cli_main
from rill.cli import serve_parser
from rill.engine_proc.kernels import extension
from rill.engine_proc.kernels.int8_linear import GEMV_MAX_ROWS, KERNEL_MAX_ROWS, Int8Linear
from rill.engine_proc.kernels.linear import PackedLinear
from rill.engine_proc.kernels.quantization import check_quantization, quantize_linears
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from rill.engine_proc.model.hf_runner import TransformersRunner
from rill.engine_proc.model.llama import LlamaForCausalLM
from rill.engine_proc.model.loader import load_config, load_model
from rill.engine_proc.model.runner import ModelRunner
from tests.helpers.generation import MESSAGES, generate, generate_logits
from tests.helpers.runners import make_runner
from tests.helpers.tiny_models import TINY

DTYPES = [torch.float32, torch.bfloat16]


def normalized_error(layer: Int8Linear, weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor) -> tuple[float, bool]:
    """(RMS error / the RMS that rounding weights to the scale's grid alone gives, max error within the worst case).

    Rounding w[n, k] to a multiple of s[n] errs uniformly in [-s/2, s/2] (std s / sqrt(12)), so
    y[m, n] errs with std s[n] * |x[m]|_2 / sqrt(12), and never more than s[n] / 2 * |x[m]|_1.
    bfloat16 (activations into the kernel, outputs) adds its own relative 2^-8 on top.
    """
    expected = torch.nn.functional.linear(x.double(), weight.double(), bias.double())
    error = layer(x).double() - expected
    scale = layer.scale.double()
    rounding_std = scale.unsqueeze(0) * x.double().norm(dim=1, keepdim=True) / math.sqrt(12)
    worst = scale.unsqueeze(0) / 2 * x.double().abs().sum(dim=1, keepdim=True)
    worst = worst + 2**-7 * (x.double().abs() @ weight.double().abs().T) + 2**-7 * expected.abs()
    rms = (error / rounding_std).pow(2).mean().sqrt().item()
    return rms, bool((error.abs() <= worst).all())


@pytest.mark.parametrize("dtype", DTYPES)
# Rill's GEMV (1, 5: one pass; 20: two passes of 8 rows and one of 4), then torch's kernel (float32
# up to 32 rows) or the dequant path.
@pytest.mark.parametrize("num_rows", [1, 5, 20, GEMV_MAX_ROWS + 3, KERNEL_MAX_ROWS[torch.float32] + 3])
@pytest.mark.parametrize("in_features", [576, 70])  # 70: padded to a multiple of 16 for the kernel
def test_int8_linear_is_the_float_linear_within_its_rounding(dtype, num_rows, in_features):
    gen = torch.Generator().manual_seed(in_features * 100 + num_rows)
    weight = (torch.randn(203, in_features, generator=gen) * 0.05).to(dtype)  # 203: rows left over from groups
    bias = torch.randn(203, generator=gen).to(dtype)
    x = torch.randn(num_rows, in_features, generator=gen).to(dtype)
    layer = Int8Linear(weight, bias)
    assert layer.weight_int8.dtype == torch.int8 and layer.weight_int8.abs().max() <= 127
    assert layer.weight_int8.shape[1] % 16 == 0 and layer(x).dtype == dtype
    rms, within_worst = normalized_error(layer, weight.float(), bias.float(), x.float())
    assert within_worst
    assert rms < 1.3, rms  # about 1: the error is the weights' rounding, nothing more

    # The same check catches scales 3% off: the error is then several times the rounding's.
    layer.scale.mul_(1.03)
    wrong_rms, _ = normalized_error(layer, weight.float(), bias.float(), x.float())
    assert wrong_rms > 2 * rms and wrong_rms > 2


def test_the_kernel_and_dequant_paths_agree():
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(3000, 576, generator=gen) * 0.05  # several dequant slices
    layer = Int8Linear(weight)
    x = torch.randn(4, 576, generator=gen)
    torch.testing.assert_close(layer.kernel_forward(x), layer.dequantized_forward(x), atol=0.02, rtol=0.01)
    torch.testing.assert_close(layer.dequantized_forward(x), x @ layer.dequantized_weight().T, atol=1e-4, rtol=1e-4)


needs_gemv = pytest.mark.skipif(not extension.available(), reason="no C++ compiler: the GEMV is not built")


@needs_gemv
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_gemv_and_torchs_kernel_agree(dtype):
    gen = torch.Generator().manual_seed(3)
    layer = Int8Linear((torch.randn(1001, 576, generator=gen) * 0.05).to(dtype))
    for num_rows in range(1, GEMV_MAX_ROWS + 1):
        x = torch.randn(num_rows, 576, generator=gen).to(dtype)
        got = layer.gemv_forward(x)
        assert got is not None and got.dtype == dtype and got.shape == (num_rows, 1001)
        weight = layer.dequantized_weight(torch.float64)
        exact = x.double() @ weight.T
        if dtype == torch.float32:
            torch.testing.assert_close(got.double(), exact, atol=1e-4, rtol=1e-4)
        else:  # the AVX512-VNNI kernel rounds bfloat16 activations to int8 per group of 32 (half a step of
            # max|x| / 127 each), then the output to bfloat16
            group_max = x.double().abs().view(num_rows, -1, 32).amax(-1, keepdim=True).expand(-1, -1, 32)
            bound = group_max.reshape(num_rows, -1) @ weight.abs().T / 254 + exact.abs() * 2**-8
            assert ((got.double() - exact).abs() <= bound + 1e-5).all(), num_rows
        # Row by row, the same numbers: each output is one row's dot products, whatever the batch.
        assert torch.equal(layer.gemv_forward(x[-1:])[0], got[-1]), num_rows


@pytest.mark.parametrize("num_rows", [1, 17, 33, 70, 515])
def test_int8_panels_are_the_dequantized_linear(num_rows, panels_kernel):
    """Outputs of two whole 64-column panels and a part, K = 96; each column's scale applied to its output."""
    gen = torch.Generator().manual_seed(num_rows)
    weight = torch.randn(150, 96, generator=gen) * torch.logspace(-2, 0, 150).unsqueeze(1)  # scales that differ
    layer = Int8Linear(weight.to(torch.bfloat16))
    x = torch.randn(num_rows, 96, generator=gen).to(torch.bfloat16)
    got = torch.ops.rill_cpu.int8_linear(x, layer.weight_int8, layer.scale, 96, 0, 1 << 21)
    want = x.double() @ layer.dequantized_weight(torch.float64).T
    # q exact in bfloat16, float32 sums, then the scale and the output's rounding to bfloat16
    assert got.dtype == torch.bfloat16 and got.shape == (num_rows, 150)
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=2**-8)
    assert torch.equal(layer(x), got) or num_rows <= GEMV_MAX_ROWS  # the layer takes them above the GEMV's rows
    if panels_kernel == "amx_tiles":  # the same tile products in the same order as brgemm's over the panels
        torch.ops.rill_cpu.quant_panels_kernel("brgemm")
        assert torch.equal(torch.ops.rill_cpu.int8_linear(x, layer.weight_int8, layer.scale, 96, 0, 1 << 21), got)


def test_without_the_gemv_int8_takes_torchs_kernel(monkeypatch):
    monkeypatch.setenv("RILL_CPU_KERNELS", "0")
    extension.available.cache_clear()
    try:
        layer = Int8Linear(torch.randn(64, 48, generator=torch.Generator().manual_seed(4)) * 0.05)
        x = torch.randn(3, 48)
        assert layer.gemv_forward(x) is None
        assert torch.equal(layer(x), layer.kernel_forward(x))
    finally:
        extension.available.cache_clear()


@pytest.mark.parametrize("dtype", DTYPES)
def test_int8_linear_traces_whole_under_torch_compile(dtype):
    """Compiled decode steps (engine_proc/model/decode_graphs.py) trace the model with fullgraph=True, their
    row count unknown while tracing: the layer must trace without a break, and the graph choose the
    path by the rows it gets at run time, as the eager layer does (a kernel for a few, the
    converted weight's GEMM for many: the kernels at 32+ rows are slower than the GEMM)."""
    gen = torch.Generator().manual_seed(2)
    layer = Int8Linear((torch.randn(64, 48, generator=gen) * 0.05).to(dtype), torch.randn(64, generator=gen).to(dtype))
    decode = layer.gemv_forward if extension.available() else layer.kernel_forward
    for num_rows, path in ((3, decode), (KERNEL_MAX_ROWS[dtype] + GEMV_MAX_ROWS, layer.dequantized_forward)):
        torch._dynamo.reset()
        compiled = torch.compile(layer, fullgraph=True, backend="eager")
        x = torch.randn(num_rows, 48, generator=gen).to(dtype)
        torch._dynamo.decorators.mark_unbacked(x, 0)
        assert torch.equal(compiled(x), path(x)), num_rows
        assert torch.equal(layer(x), path(x)), num_rows


@pytest.mark.parametrize("tied", [True, False])
def test_quantize_linears_replaces_every_linear_and_the_head(tied):
    config = LlamaConfig(**TINY, tie_word_embeddings=tied)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    model.init_dummy_weights()
    embedding = model.embed_tokens.weight.clone()
    num_linears = sum(type(m) is nn.Linear for m in model.modules())
    assert num_linears == 4 * config.num_hidden_layers + (0 if tied else 1)
    assert quantize_linears(model) == 4 * config.num_hidden_layers + 1
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert isinstance(model.lm_head, Int8Linear) and model.lm_head.out_features == config.vocab_size
    # The lookup keeps the float embedding; a tied head is a quantized copy of it.
    assert torch.equal(model.embed_tokens.weight, embedding)
    if tied:
        torch.testing.assert_close(model.lm_head.dequantized_weight(), embedding,
                                   atol=float(model.lm_head.scale.max()), rtol=0)


def test_load_model_int8_instead_of_packing(model_dir, tmp_path):
    shutil.copy(model_dir / "config.json", tmp_path / "config.json")
    config = load_config(tmp_path)
    model = load_model(tmp_path, config, load_format="dummy", quantization="int8")
    assert not any(isinstance(m, (nn.Linear, PackedLinear)) for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 4 * config.num_hidden_layers + 1
    with pytest.raises(ValueError, match="expected one of"):
        load_model(tmp_path, config, load_format="dummy", quantization="fp8")


@pytest.fixture(scope="module")
def prompts(model_dir) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]) for m in MESSAGES]


@pytest.mark.parametrize("dtype, impl", [*((dtype, "native") for dtype in DTYPES), (torch.float32, "transformers")])
def test_int8_runner_mostly_agrees_with_the_float_runner(model_dir, prompts, dtype, impl):
    """The native model, and transformers' own on the paged transformers route (its q, k, v, gate
    and up projections separate: 7 linears a layer)."""
    runner_class = PagedTransformersRunner if impl == "transformers" else None

    def runner(quantization: str) -> ModelRunner:
        return make_runner(model_dir, dtype=dtype, num_kv_blocks=48, eos_token_ids=[2], quantization=quantization,
                           runner_class=runner_class)

    reference, int8 = runner("none"), runner("int8")
    per_layer = 7 if impl == "transformers" else 4
    assert sum(isinstance(m, Int8Linear) for m in int8.model.modules()) == per_layer * 30 + 1
    expected, got = generate(reference, prompts, max_tokens=12), generate(int8, prompts, max_tokens=12)
    prefix_lens = [next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), len(e)) for e, g in zip(expected, got)]
    # Greedy decoding amplifies any change at a near tie, so not every token: most of them. In
    # bfloat16 the float runner's own rounding flips near ties (bench/results/quant_quality-cpu.md:
    # bf16 against float32 agrees on 58% of 32-token outputs), so 3 prompts say little there; the
    # first token's distribution below is the check for both dtypes.
    if dtype == torch.float32:
        assert sum(prefix_lens) >= 0.5 * 12 * len(prompts), (prefix_lens, expected, got)
    # The first token's distribution barely moves.
    logits = [generate_logits(r, prompts) for r in (reference, int8)]
    probs = [lg.float().softmax(-1) for lg in logits]
    kl = (probs[0] * (probs[0].clamp_min(1e-12).log() - probs[1].clamp_min(1e-12).log())).sum(-1)
    assert kl.max() < 0.05, kl


def test_int8_is_refused_where_it_does_not_run(model_dir):
    with pytest.raises(ValueError, match="CPU-only"):
        make_runner(model_dir, num_kv_blocks=4, eos_token_ids=[2], device="cuda", quantization="int8")
    with pytest.raises(ValueError, match="native model only"):
        make_runner(model_dir, runner_class=TransformersRunner, num_kv_blocks=4, eos_token_ids=[2], quantization="int8")


def test_cli_takes_int8_and_rejects_an_unknown_method(capsys):
    parser = argparse.ArgumentParser(prog="rill")
    serve_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["serve"]).quantization == "none"
    assert parser.parse_args(["serve", "--quantization", "int8"]).quantization == "int8"
    assert parser.parse_args(["serve", "-q", "int8"]).quantization == "int8"
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["serve", "--quantization", "awq"])
    assert exc.value.code == 2
    assert "invalid choice: 'awq'" in capsys.readouterr().err
    args = parser.parse_args(["serve", "-q", "int4", "--int4-group-size", "128", "--int4-symmetric"])
    assert (args.int4_group_size, args.int4_symmetric) == (128, True)
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "-q", "int4", "--int4-group-size", "64"])
    assert "invalid choice: 64" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [["--int4-symmetric"], ["-q", "int8", "--int4-group-size", "128"]])
def test_int4_options_without_int4_exit_2_naming_the_flag(flags, capsys):
    with pytest.raises(SystemExit) as done:
        cli_main(["serve", *flags])
    stderr = capsys.readouterr().err
    assert done.value.code == 2 and "is an option of --quantization int4" in stderr and flags[-1] in stderr, stderr


def test_int4_options_are_refused_without_int4():
    check_quantization("int4", torch.device("cpu"), 128, True)
    with pytest.raises(ValueError, match="int4's options, not int8's"):
        check_quantization("int8", torch.device("cpu"), 32, True)
    with pytest.raises(ValueError, match="--int4-group-size 64"):
        check_quantization("int4", torch.device("cpu"), 64)


@pytest.fixture
def one_thread():
    """The benchmarks' --num-threads 1 sets torch's global; put it back for the tests after."""
    num_threads = torch.get_num_threads()
    yield
    torch.set_num_threads(num_threads)


def test_quant_quality_quick_writes_its_files(tmp_path, one_thread):
    out = tmp_path / "quant_quality-test.json"
    quant_quality.main(["--quick", "--dtypes", "float32", "--methods", "int4,int4-sym-g128", "--num-threads", "1",
                        "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"command", "date", "machine", "params", "results"} <= report.keys()
    assert report["machine"]["cpu_model"] and "cpu_flags" in report["machine"]
    rows = report["results"]["rows"]
    assert [(r["dtype"], r["quantization"]) for r in rows] == [("float32", q) for q in ("none", "int4", "int4-sym-g128")]
    assert all(1 < r["ppl_prefill"] < 1000 and 1 < r["ppl_decode"] < 1000 for r in rows)
    assert rows[1]["weight_bytes"] < 0.4 * rows[0]["weight_bytes"]  # the float embedding, and 5 bits a weight
    assert rows[2]["weight_bytes"] < rows[1]["weight_bytes"]  # 4.125 bits: from floats, not the file's Q4_1 blocks
    assert 0 <= rows[1]["greedy_vs_none"]["identical"] <= 1
    assert "ppl prefill" in out.with_suffix(".md").read_text()


def test_quant_linears_quick_writes_its_files(tmp_path, one_thread):
    out = tmp_path / "quant_linears-test.json"
    quant_linears.main(["--quick", "--num-threads", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert {r["shape"] for r in report["results"]} == {name for name, _, _ in quant_linears.SHAPES}
    assert all(ms > 0 for r in report["results"] for ms in r["ms"].values())
    assert "lm_head (49152 x 576)" in out.with_suffix(".md").read_text()
