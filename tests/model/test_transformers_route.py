"""The paged transformers route (engine_proc/model/hf_paged.py) on a zoo of tiny random-weight models,
one per family without a native implementation (tests/helpers/tiny_models.py): through the real
scheduler, every sampled row's logits are transformers' own over the whole sequence, with prompts
and generations longer than the sliding windows, batched, in chunks, after a prefix-cache hit and
after preemption."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from rill.engine_proc.attention.kv_layout import kv_sources, layer_kv_shapes
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.spec.build import build_speculator
from rill.engine_proc.spec.speculator import Speculator
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BlockAllocator
from tests.helpers.runners import make_runner
from tests.helpers.scheduled import (
    BLOCK_SIZE,
    EOS_ID,
    PROMPTS,
    SHARED,
    hf_continuations,
    outputs,
    run_scheduled,
)
from tests.helpers.tiny_models import PAGED_ROUTE_KINDS, save_tiny_model

KINDS = (*PAGED_ROUTE_KINDS, "phi3-window", "gpt2", "gpt_neox")  # Gemma 4's checkpoint class: tests/e2e
MOE_KINDS = ("qwen3_moe", "mixtral", "gpt_oss", "gemma4-moe", "phimoe-window", "hunyuan_v1_moe", "deepseek_v3",
             "qwen3_next", "granitemoehybrid", "lfm2_moe")  # (Nemotron-H's experts stay transformers' own)


@dataclass
class Zoo:
    kind: str
    model_dir: Path
    hf_model: torch.nn.Module
    runner: PagedTransformersRunner
    expected: dict[str, list[int]]


@pytest.fixture(scope="module", params=KINDS)
def zoo(request, tmp_path_factory) -> Zoo:
    model_dir = tmp_path_factory.mktemp(request.param)
    hf = save_tiny_model(request.param, model_dir)
    runner = make_runner(model_dir, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID])
    return Zoo(request.param, model_dir, hf, runner, hf_continuations(hf))


def test_batched_prompts_match_transformers(zoo):
    reqs = run_scheduled(zoo.runner, zoo.hf_model, {"a": 0, "b": 0, "c": 0})
    assert outputs(reqs) == {k: zoo.expected[k] for k in "abc"}


def test_chunked_prefill_mixed_with_decodes_matches_transformers(zoo):
    # A budget of 5 tokens splits every prompt into chunks and mixes them with decodes.
    reqs = run_scheduled(zoo.runner, zoo.hf_model, {"a": 0, "b": 2, "c": 5}, max_num_batched_tokens=5)
    assert outputs(reqs) == {k: zoo.expected[k] for k in "abc"}


def test_prefix_cache_hit_matches_transformers(zoo):
    if zoo.runner.linear_states is not None:
        pytest.skip("a model with linear-attention layers is served without prefix caching (engine_proc/main.py)")
    reqs = run_scheduled(zoo.runner, zoo.hf_model, {"a": 0, "b": 0, "a2": 6}, caching=True)
    assert reqs["a2"].num_cached_tokens == len(SHARED) // BLOCK_SIZE * BLOCK_SIZE
    assert outputs(reqs) == {k: zoo.expected[k] for k in ("a", "b", "a2")}


class OracleProposer:
    """Drafts transformers' own next tokens for each request, the third one wrong: drafts kept and refused."""

    def __init__(self, expected: dict[str, list[int]]) -> None:
        self.expected = expected

    def propose(self, req, max_drafts: int) -> list[int]:
        ahead = self.expected[req.req_id][len(req.output_ids):][:max_drafts]
        return [max(token - 1, 1) if j == 2 and token != 1 else token for j, token in enumerate(ahead)]


def test_drafts_are_verified_as_transformers_would(zoo):
    """Speculative drafts (and so predicted outputs, jump-forward and n-grams) on the route: every draft's row is
    transformers' logits after the drafts before it, beside other requests' prompts and decodes."""
    if zoo.runner.linear_states is not None:  # its layers' states cannot be rewound past a refused draft
        assert build_speculator("", zoo.runner) == (None, "")
        with pytest.raises(ValueError, match="not served for a model with linear-attention layers"):
            build_speculator('{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}', zoo.runner)
        pytest.skip("a model with linear-attention layers is served without drafts")
    speculator = Speculator(OracleProposer(zoo.expected), 4)
    reqs = run_scheduled(zoo.runner, zoo.hf_model, {"a": 0, "b": 2, "c": 3}, max_num_batched_tokens=16,
                         speculator=speculator)
    assert outputs(reqs) == {k: zoo.expected[k] for k in "abc"}
    stats = speculator.stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens, stats


def test_preempted_requests_match_transformers(zoo):
    # 8 blocks of 8 tokens (one reserved) cannot hold the three requests at their full length. A
    # model whose every layer slides holds its window only (released blocks): it may fit them. One with
    # window tables needs 12 for "a" alone (the scheduler's bound: half the cache, with one window table).
    num_blocks = 13 if zoo.runner.layer_window else 8
    reqs = run_scheduled(zoo.runner, zoo.hf_model, {"a": 0, "b": 0, "c": 0}, num_blocks=num_blocks,
                         caching=zoo.runner.linear_states is None)  # as the engine serves it (main.py)
    if zoo.runner.sliding_window is None:
        assert sum(r.num_preemptions for r in reqs.values()) > 0
    assert outputs(reqs) == {k: zoo.expected[k] for k in "abc"}


@pytest.mark.parametrize("kind, window", [("mistral-window", 16), ("phi3-window", 32), ("phimoe-window", 16),
                                          ("gemma3_text", None), ("gpt_oss", None)])
def test_a_sliding_layer_holds_its_window_of_blocks(kind, window, tmp_path):
    """Mistral's, Phi-3-mini's and PhiMoE's layers all slide (PhiMoE's through its mask alone): a request holds the
    blocks of its last `window` positions and the one being written, the rest released as it goes (and its logits
    stay transformers'). Gemma 3 and GPT-OSS have global layers too, which need every block: their sliding
    layers have window tables of their own (window_tables.py), which hold a request's window."""
    hf = save_tiny_model(kind, tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID])
    assert runner.sliding_window == window
    held, held_window = [], []
    most = lambda tables: max((sum(b != 0 for b in t) for t in tables), default=0)  # noqa: E731
    track = lambda reqs: (held.append(most([r.block_ids for r in reqs])),  # noqa: E731
                          held_window.append(most([t for r in reqs for t in r.window_block_ids])))
    reqs = run_scheduled(runner, hf, {"a": 0, "c": 0}, num_new_tokens=40, on_step=track)
    longest_blocks = -(-max(r.num_tokens for r in reqs.values()) // BLOCK_SIZE)
    own_window = window or runner.config.sliding_window
    if window is None:
        assert runner.layer_window == (own_window, tuple(range(0, runner.config.num_hidden_layers, 2)))
        assert max(held) == longest_blocks
        assert 0 < max(held_window) <= -(-own_window // BLOCK_SIZE) + 1 < longest_blocks
    else:
        assert runner.layer_window is None and max(held_window) == 0
        assert max(held) <= -(-window // BLOCK_SIZE) + 1 < longest_blocks


@pytest.mark.parametrize("kind", ["olmo2", "gemma3_text", "gpt_oss", "gemma4_text"])
def test_the_triton_backend_under_the_route_matches_transformers(kind, tmp_path):
    """The GPU's attention backend (on a GPU when there is one, else on CPU tensors under Triton's
    interpreter): its flat step layout, the masked layers' view of it and Gemma 3's and GPT-OSS's
    window tables included, Gemma 4's layers of two shapes, in chunks mixed with decodes (bench/gpu_tier.sh
    runs it on a GPU)."""
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    hf = save_tiny_model(kind, tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], attention_backend="triton",
                         device="cuda" if torch.cuda.is_available() else "cpu")
    assert runner.attention.flat
    reqs = run_scheduled(runner, hf, {"a": 0, "b": 2, "c": 5}, max_num_batched_tokens=5)
    assert outputs(reqs) == {k: v for k, v in hf_continuations(hf).items() if k in "abc"}


def test_runner_holds_a_paged_cache_of_the_models_shape(zoo):
    cache = zoo.runner.kv_cache
    config = zoo.runner.config.get_text_config()
    assert cache.num_blocks == 64 and len(cache.k_caches) == config.num_hidden_layers
    # Each layer's own K/V shape: Gemma 4's global layers one head of 32 (its sliding ones two of 16)
    shapes = [tuple(k.shape[-2:]) for k in cache.k_caches]
    assert shapes == [tuple(v.shape[-2:]) for v in cache.v_caches] == layer_kv_shapes(config)
    assert (shapes == [(2, 16), (1, 32)] * 2) == (zoo.kind == "gemma4_text")
    # Layers that reuse others' K/V (Gemma 4's last two) hold those layers' tensors, and linear-attention layers
    # (Qwen3.5's first and third) a full layer's they never touch: memory for the layers that keep their own only
    sources = kv_sources(config)
    assert sources == {"gemma4_text": [0, 1, 0, 1], "qwen3_5_text": [1, 1, 1, 3], "qwen3_next": [1, 1, 1, 3],
                       "granitemoehybrid": [1, 1, 1, 3], "nemotron_h": [1, 1, 1, 1], "lfm2": [1, 1, 1, 3],
                       "lfm2_moe": [1, 1, 1, 3]}.get(zoo.kind, list(range(config.num_hidden_layers)))
    if not zoo.runner.layer_window:
        pointers = [k.data_ptr() for k in cache.k_caches]
        assert all(pointers[i] == pointers[source] for i, source in enumerate(sources))
        assert len(set(pointers)) == len(set(sources))
        assert cache.num_bytes == sum(2 * 64 * BLOCK_SIZE * shapes[i][0] * shapes[i][1] * 4  # float32
                                      for i in set(sources))
    assert zoo.runner.info.kind == "transformers" and zoo.runner.info.attention_backend in ("cpu", "torch")
    # the MoE families' experts run on the native linear kernels (hf_experts.py): the tests above checked them
    packed = [m for m in zoo.runner.model.modules() if hasattr(m, "rill_gate_up_proj")]
    # DeepSeek's and LFM2-MoE's first layers: a plain MLP
    dense = getattr(config, "first_k_dense_replace", 0) or getattr(config, "num_dense_layers", 0)
    assert len(packed) == (config.num_hidden_layers - dense if zoo.kind in MOE_KINDS else 0)
    assert all(m.config._experts_implementation == "rill_experts" and m.gate_up_proj.numel() == 0 for m in packed)


@pytest.mark.parametrize("kind", MOE_KINDS)
def test_int8_experts_barely_move_the_logits(kind, tmp_path):
    """--quantization int8 on a mixture of experts: every expert's projections int8 too."""
    from rill.engine_proc.kernels.int8_linear import Int8Linear

    hf = save_tiny_model(kind, tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], quantization="int8")
    experts = [m for m in runner.model.modules() if hasattr(m, "rill_gate_up_proj")]
    assert experts and all(isinstance(layer, Int8Linear) for m in experts for layer in m.rill_down_proj)
    req = EngineRequest("a", "w", list(PROMPTS["a"]), SamplingParams(max_tokens=1))
    n = -(-req.num_tokens // BLOCK_SIZE)  # blocks for the global table, then each window table's own
    req.block_ids = list(range(1, 1 + n))
    req.window_block_ids = [list(range(1 + j * n, 1 + (j + 1) * n)) for j in range(1, runner.kv_cache.num_window_groups + 1)]
    got = runner.compute_logits(Batch([ScheduledSeq(req, 0, req.num_tokens)]))[0].softmax(-1)
    with torch.inference_mode():
        want = hf(torch.tensor([PROMPTS["a"]])).logits[0, -1].softmax(-1)
    # Qwen3-Next's linear layers carry int8's rounding over every token in their recurrent state
    assert float((want * (want.log() - got.log())).sum()) < (1e-2 if kind == "qwen3_next" else 1e-4)


@pytest.mark.parametrize("kind", ["olmo2", "gemma3_text", "gpt_oss"])
def test_batch_invariant_logits_do_not_depend_on_the_batch(kind, tmp_path):
    """--batch-invariant on the route: a prompt's logits alone and beside other prompts and decodes are
    bit for bit the same (MoE families are refused: their experts see a batch-dependent row count)."""
    hf = save_tiny_model(kind, tmp_path)
    build = lambda: make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64,  # noqa: E731
                                block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID], batch_invariant=True)
    if kind == "gpt_oss":
        with pytest.raises(ValueError, match="--batch-invariant is not served for mixture-of-experts"):
            build()
        return
    runner = build()
    free_ids = BlockAllocator(64, seed=3).free_ids  # shuffled, never block 0
    reqs = {name: EngineRequest(name, "w", list(PROMPTS[name]), SamplingParams(max_tokens=1)) for name in PROMPTS}
    for req in reqs.values():
        n = -(-req.num_tokens // BLOCK_SIZE)
        req.block_ids = [free_ids.pop() for _ in range(n)]
        req.window_block_ids = [[free_ids.pop() for _ in range(n)] for _ in range(runner.kv_cache.num_window_groups)]
    a = reqs["a"]
    alone = runner.compute_logits(Batch([ScheduledSeq(a, 0, a.num_tokens)]))
    runner.compute_logits(Batch([ScheduledSeq(reqs["c"], 0, 17)]))  # c's first 17 tokens in the cache
    mixed = runner.compute_logits(Batch([ScheduledSeq(reqs["c"], 17, 1), ScheduledSeq(reqs["b"], 0, 9),
                                         ScheduledSeq(a, 0, a.num_tokens)]))
    assert torch.equal(alone[0], mixed[2])
    with torch.inference_mode():
        torch.testing.assert_close(alone[0], hf(torch.tensor([PROMPTS["a"]])).logits[0, -1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_auto_serves_the_zoo_on_the_paged_route(kind):
    from rill.engine_proc.model.choice import choose_runner
    from tests.helpers.tiny_models import tiny_config

    assert choose_runner("auto", tiny_config(kind)) is PagedTransformersRunner


def test_a_model_the_paged_route_cannot_run_is_refused_with_why(tmp_path):
    """Built directly (not through choose_runner, which would take the one-sequence runner)."""
    save_tiny_model("olmo2", tmp_path)
    config = (tmp_path / "config.json").read_text().replace(
        '"model_type"', '"layer_types": ["full_attention", "linear_attention"], "model_type"')
    (tmp_path / "config.json").write_text(config)
    with pytest.raises(ValueError, match="cannot run this model: its 'linear_attention' layers have no paged form"):
        make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=8, eos_token_ids=[EOS_ID])


def test_lora_on_a_model_whose_layers_differ_in_shape_is_refused_at_start(tmp_path):
    save_tiny_model("gemma4_text", tmp_path)
    with pytest.raises(ValueError, match="--enable-lora is not served for a model whose layers differ in shape"):
        make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=8, eos_token_ids=[EOS_ID],
                    max_loras=1)


def test_a_soft_capped_chunk_goes_a_few_queries_at_a_time(monkeypatch, tmp_path):
    """Gemma 2's explicit scores are [heads, queries, keys]: a chunk's queries go EXPLICIT_QUERIES at
    a time (5 here, so the 29-token prompt splits unevenly), with transformers' logits."""
    from rill.engine_proc.attention import masked

    hf = save_tiny_model("gemma2", tmp_path)
    runner = make_runner(tmp_path, runner_class=PagedTransformersRunner, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID])
    calls = []
    attend = masked._attend
    monkeypatch.setattr(masked, "EXPLICIT_QUERIES", 5)
    monkeypatch.setattr(masked, "_attend", lambda q, *args: calls.append(q.shape[1]) or attend(q, *args))
    reqs = run_scheduled(runner, hf, {"a": 0, "c": 0})
    assert outputs(reqs) == {k: v for k, v in hf_continuations(hf).items() if k in "ac"}
    assert 5 in calls and 4 in calls  # a's 29 prompt rows: 5 x 5 and 4
