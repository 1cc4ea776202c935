"""The native model runner against transformers: same greedy tokens, same logits, any batching."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rill.engine_proc.attention.kv_layout import bytes_per_block
from rill.engine_proc.model.loader import load_config
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BLOCK_SIZE, EOS_ID, BlockAllocator, generate
from tests.helpers.runners import make_runner
from tests.helpers.tiny_models import save_tiny_model

ROOT = Path(__file__).resolve().parents[2]


def test_limits_come_from_the_config(runner):
    assert runner.vocab_size == 49152
    assert runner.max_model_len == 8192


def test_each_prompt_alone_matches_transformers(runner, prompts, hf_tokens):
    for ids, expected in zip(prompts, hf_tokens):
        assert generate(runner, [ids]) == [expected]


def test_prompts_batched_together_match_transformers(runner, prompts, hf_tokens):
    assert generate(runner, prompts) == hf_tokens


def test_chunked_prefill_mixed_with_decodes_matches_transformers(runner, prompts, hf_tokens):
    # Chunks of 7 cross block boundaries at odd offsets; staggered arrivals put prefill
    # chunks of one request in the same steps as decode tokens of another.
    assert generate(runner, prompts, chunk_len=7, arrival_steps=[0, 3, 9]) == hf_tokens


def test_prompt_logits_match_transformers(runner, prompts, hf_model):
    reqs = [EngineRequest(f"r{i}", "w", ids, SamplingParams(max_tokens=1)) for i, ids in enumerate(prompts)]
    allocator = BlockAllocator(runner.kv_cache.num_blocks, seed=1)
    for req in reqs:
        allocator.cover(req, req.num_tokens)
    logits = runner.compute_logits(Batch([ScheduledSeq(r, 0, r.num_tokens) for r in reqs]))
    with torch.inference_mode():
        for row, ids in zip(logits, prompts):
            expected = hf_model(torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(row, expected, atol=2e-4, rtol=1e-4)


def test_the_last_layer_runs_past_its_kv_writes_on_the_head_rows_alone(runner, prompts):
    """A prefill's last layer: o_proj and the MLP see only the rows the head reads, and the logits
    are those of the full layer (LoRA's per-row masks keep every row: all_rows_to_the_end)."""
    reqs = [EngineRequest(f"r{i}", "w", ids, SamplingParams(max_tokens=1)) for i, ids in enumerate(prompts[:2])]
    allocator = BlockAllocator(runner.kv_cache.num_blocks, seed=1)
    for req in reqs:
        allocator.cover(req, req.num_tokens)
    seen = []
    hook = runner.model.layers[-1].mlp.register_forward_hook(lambda m, args, out: seen.append(args[0].shape[0]))
    try:
        trimmed = runner.compute_logits(Batch([ScheduledSeq(r, 0, r.num_tokens) for r in reqs]))
        runner.model.all_rows_to_the_end = True
        full = runner.compute_logits(Batch([ScheduledSeq(r, 0, r.num_tokens) for r in reqs]))
    finally:
        runner.model.all_rows_to_the_end = False
        hook.remove()
    assert seen == [2, sum(r.num_tokens for r in reqs)]
    torch.testing.assert_close(trimmed, full, atol=1e-5, rtol=1e-5)


def test_kv_blocks_for_memory(model_dir):
    per_block = 2 * 30 * BLOCK_SIZE * 3 * 64 * 4  # K and V, 30 layers, 3 KV heads of 64, fp32
    num_blocks = ModelRunner.num_kv_blocks_for_memory(model_dir, dtype=torch.float32, block_size=BLOCK_SIZE, memory_bytes=2**30)
    assert num_blocks == 2**30 // per_block
    assert bytes_per_block(load_config(model_dir), torch.bfloat16, BLOCK_SIZE) == per_block // 2


def test_dummy_weights_read_no_weight_file(model_dir, tmp_path):
    shutil.copy(model_dir / "config.json", tmp_path / "config.json")  # no weights beside it
    runner = make_runner(tmp_path, num_kv_blocks=16, eos_token_ids=[EOS_ID], load_format="dummy")
    tokens = generate(runner, [[1, 2, 3, 4, 5]], max_tokens=3)
    assert all(0 <= t < runner.vocab_size for t in tokens[0])



@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}],
                         ids=["bundled", "llama3-rope"])
def test_an_eager_runner_imports_neither_the_compiler_nor_transformers(model_dir, tmp_path, rope):
    """Choosing and building the eager runner (as `rill serve --enforce-eager` does) imports no torch._dynamo (a random
    init of the embedding on the meta device once did, 0.8 s of every eager engine's start), no transformers (its
    config classes' 1.4 s: engine_proc/model/config_json.py reads the bundled model's config, and Llama 3.x's RoPE
    scaling, which engine_proc/model/rope.py computes) and no sympy (torch's Python meta kernels, which to_empty ran:
    memory.empty_like_on)."""
    if rope is not None:  # the bundled model's files, its config with Llama 3.2's scaling
        for path in model_dir.iterdir():
            (tmp_path / path.name).symlink_to(path)
        (tmp_path / "config.json").unlink()
        config = json.loads((model_dir / "config.json").read_text())
        config["rope_parameters"] = {**config["rope_parameters"], **rope}  # as transformers 5 writes it
        (tmp_path / "config.json").write_text(json.dumps(config))
        model_dir = tmp_path
    code = ("import sys, torch; from pathlib import Path; from tests.helpers.runners import make_runner; "
            "from rill.engine_proc.model.choice import choose_runner, eos_token_ids; "
            "from rill.engine_proc.model.loader import load_config; "
            f"d = Path({str(model_dir)!r}); config = load_config(d); runner_class = choose_runner('auto', config); "
            f"assert eos_token_ids(d, config) == [{EOS_ID}]; "
            f"make_runner(d, num_kv_blocks=16, eos_token_ids=[{EOS_ID}], dtype=torch.bfloat16); "
            "print(runner_class.__name__, *(name in sys.modules for name in ('torch._dynamo', 'transformers', 'sympy')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-4:] == ["ModelRunner", "False", "False", "False"]

# ---- other architectures: tiny random models saved by transformers ------------------------


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_rope_that_changes_with_the_length_goes_to_the_transformers_route(rope_type):
    """transformers recomputes these frequencies as a sequence grows: the native runner refuses them,
    and --model-impl auto serves such a model on the paged transformers route, per sequence
    (engine_proc/model/hf_rope.py; tests/model/test_transformers_route.py checks the tokens)."""
    from transformers import LlamaConfig

    from rill.engine_proc.model.choice import choose_runner
    from rill.engine_proc.model.hf_paged import PagedTransformersRunner
    from rill.engine_proc.model.llama import check_supported

    rope = {"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0] * 8, "long_factor": [2.0] * 8}
    config = LlamaConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=256, rope_parameters=rope)
    with pytest.raises(ValueError, match=rope_type):
        check_supported(config)
    assert choose_runner("auto", config) is PagedTransformersRunner


@pytest.mark.parametrize("kind", ["llama3-rope-untied", "qwen2", "qwen3", "qwen3-yarn", "granite", "granite-untied-biased",
                                  "smollm3", "phi3"])
def test_tiny_architectures_match_transformers(kind, tmp_path):
    hf = save_tiny_model(kind, tmp_path)
    runner = make_runner(tmp_path, num_kv_blocks=32, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID])
    ids = torch.randint(3, 128, (1, 70)).tolist()[0]
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0]
    # Prefill in chunks of 23 on top of the cache; compare the logits at each chunk's end.
    req = EngineRequest("r", "w", ids, SamplingParams(max_tokens=1))
    BlockAllocator(runner.kv_cache.num_blocks).cover(req, len(ids))
    for start in range(0, len(ids), 23):
        num_new = min(23, len(ids) - start)
        seq = ScheduledSeq(req, start, num_new)
        req.output_ids, req.prompt_ids = [], ids[: start + num_new]  # makes this chunk the sampled one
        logits = runner.compute_logits(Batch([seq]))
        torch.testing.assert_close(logits[0], expected[start + num_new - 1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["granite", "granite-untied-biased", "smollm3", "phi3"])
@pytest.mark.parametrize("variant", ["bfloat16", "int8"])
def test_the_newer_native_families_in_bfloat16_and_int8(kind, variant, tmp_path):
    """Granite's folded multipliers, SmolLM3's NoPE layers and Phi-3's split projections under the
    served defaults' dtype (bfloat16) and under --quantization int8: the next token's distribution
    stays transformers' (float32) within their rounding."""
    hf = save_tiny_model(kind, tmp_path)
    extra = {"dtype": torch.bfloat16} if variant == "bfloat16" else {"quantization": "int8"}
    runner = make_runner(tmp_path, num_kv_blocks=32, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID], **extra)
    ids = torch.randint(3, 128, (1, 40)).tolist()[0]
    req = EngineRequest("r", "w", ids, SamplingParams(max_tokens=1))
    BlockAllocator(runner.kv_cache.num_blocks).cover(req, len(ids))
    got = runner.compute_logits(Batch([ScheduledSeq(req, 0, len(ids))]))[0].float().softmax(-1)
    with torch.inference_mode():
        want = hf(torch.tensor([ids])).logits[0, -1].softmax(-1)
    kl = float((want * (want.log() - got.clamp_min(1e-12).log())).sum())
    assert kl < 1e-3, kl


def test_granite_refuses_lora_at_start(tmp_path):
    """Granite's multipliers are folded into the weights an adapter adds to: refused, not wrong."""
    save_tiny_model("granite", tmp_path)
    with pytest.raises(ValueError, match="--enable-lora is not served for model_type 'granite'"):
        make_runner(tmp_path, num_kv_blocks=32, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID], max_loras=1)


@pytest.mark.parametrize("kind, reason", [("phi3-window", "sliding-window"), ("phi3-partial-rotary", "partial rotary")])
def test_a_phi3_the_native_model_cannot_run_takes_the_transformers_route(kind, reason):
    from rill.engine_proc.model.choice import choose_runner
    from rill.engine_proc.model.hf_paged import PagedTransformersRunner
    from rill.engine_proc.model.llama import check_supported
    from tests.helpers.tiny_models import tiny_config

    config = tiny_config(kind)
    with pytest.raises(ValueError, match=reason):
        check_supported(config)
    assert choose_runner("auto", config) is PagedTransformersRunner


def hf_greedy(hf, prompt: list[int], num_tokens: int) -> list[int]:
    """transformers' greedy continuation, each token from a full forward (no cache to get wrong)."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(num_tokens):
            ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("kind", ["granite", "smollm3"])
def test_tiny_architectures_through_the_compiled_decode_graph(kind, tmp_path):
    """What these families add to a step (Granite's head scale, SmolLM3's NoPE rotations) inside the
    compiled decode graph: transformers' greedy tokens, with the decode steps through the graph."""
    hf = save_tiny_model(kind, tmp_path)
    runner = make_runner(tmp_path, num_kv_blocks=32, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID],
                         compile_decode=True, max_num_seqs=4)
    assert runner.decode_graphs is not None, "torch.compile failed: see the warning in the log"
    run, runs = runner.decode_graphs.run, []
    runner.decode_graphs.run = lambda batch: runs.append(1) or run(batch)
    prompts = [torch.randint(3, 128, (n,)).tolist() for n in (9, 21)]
    assert generate(runner, prompts, max_tokens=8) == [hf_greedy(hf, p, 8) for p in prompts]
    assert len(runs) >= 7
