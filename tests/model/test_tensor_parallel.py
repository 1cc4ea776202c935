"""Tensor parallelism on the CPU (gloo): two ranks' shards give the one-rank model's output.

Rank 0 runs in a spawned process as the engine runs it (engine_proc/parallel/ranks.py starts rank 1
and sends it every step through shared memory); the test compares its greedy tokens and logits with
a one-rank runner's. The bundled model's 3 KV heads split 2 + 1, so the uneven split is
what is tested; its first 4 layers and head (`short_model_dir`) are every sharded module, at a seventh of
the all-reduces. Float32: the all-reduce adds two partial sums where one rank adds one, so logits
differ by rounding only; the tolerance below is 1e-3 absolute on logits of magnitude ~10-30.
"""
from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from rill.engine_proc.parallel.sharding import Shard, split_range
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BLOCK_SIZE, EOS_ID, BlockAllocator, generate

LOGITS_ATOL = 1e-3


def _prompt_logits(runner, prompts):
    reqs = [EngineRequest(f"r{i}", "w", ids, SamplingParams(max_tokens=1)) for i, ids in enumerate(prompts)]
    allocator = BlockAllocator(runner.kv_cache.num_blocks, seed=1)
    for req in reqs:
        allocator.cover(req, req.num_tokens)
    return runner.compute_logits(Batch([ScheduledSeq(r, 0, r.num_tokens) for r in reqs]))


def _rank0(model_dir, prompts, compile_decode, results) -> None:
    from rill.engine_proc.model.runner import ModelRunner
    from rill.engine_proc.parallel.group import RankSetup
    from rill.engine_proc.parallel.ranks import TensorParallel
    from rill.ipc.config import LogConfig, ModelConfig, ParallelConfig

    torch.set_num_threads(1)
    model = ModelConfig(model_dir=str(model_dir), block_size=BLOCK_SIZE, enforce_eager=not compile_decode,
                        max_num_seqs=8, num_threads=1)
    tp = TensorParallel(ParallelConfig(tensor_parallel_size=2, master_addr=""), "cpu", LogConfig(level="WARNING"))
    try:
        tp.share(RankSetup(model, "float32", 64, [EOS_ID]))
        runner = ModelRunner(model, dtype=torch.float32, device="cpu", num_kv_blocks=64, eos_token_ids=[EOS_ID],
                             tp_size=2, step_broadcast=tp)
        logits = _prompt_logits(runner, prompts)
        tokens = generate(runner, prompts, chunk_len=7, arrival_steps=[0, 3, 9], max_tokens=16)
        results.put((logits.numpy(), tokens, runner.kv_cache.num_kv_heads))  # by value, not by descriptor
    finally:
        tp.stop()


def run_tp2(model_dir, prompts, compile_decode=False):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_rank0, args=(model_dir, prompts, compile_decode, results))
    proc.start()
    logits, tokens, num_kv_heads = results.get(timeout=600)
    proc.join(60)
    assert proc.exitcode == 0
    return torch.from_numpy(logits), tokens, num_kv_heads


@pytest.fixture(scope="module")
def tp2(short_model_dir, prompts):
    return run_tp2(short_model_dir, prompts)


def test_split_range_covers_every_item_once():
    for total, size in [(3, 2), (9, 2), (1536, 2), (49152, 3), (7, 4)]:
        parts = [split_range(total, size, r) for r in range(size)]
        assert parts[0][0] == 0 and parts[-1][1] == total
        assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
        assert max(e - s for s, e in parts) - min(e - s for s, e in parts) <= 1


def test_shards_hold_whole_kv_heads_and_their_queries(short_runner):
    shards = [Shard(r, 2, short_runner.config) for r in range(2)]
    assert [s.kv_heads for s in shards] == [(0, 2), (2, 3)]
    assert [s.q_heads for s in shards] == [(0, 6), (6, 9)]  # 3 query heads per KV head
    assert shards[1].local_config().num_attention_heads == 3
    with pytest.raises(ValueError, match="KV heads"):
        Shard(0, 4, short_runner.config)


def test_two_ranks_give_one_rank_logits(tp2, short_runner, prompts):
    logits, _, num_kv_heads = tp2
    assert num_kv_heads == 2  # rank 0 holds 2 of the 3 KV heads
    torch.testing.assert_close(logits, _prompt_logits(short_runner, prompts), atol=LOGITS_ATOL, rtol=0)


def test_two_ranks_give_one_rank_greedy_tokens(tp2, short_runner, prompts):
    _, tokens, _ = tp2
    assert tokens == generate(short_runner, prompts, chunk_len=7, arrival_steps=[0, 3, 9], max_tokens=16)


@pytest.mark.parametrize("kind", ["granite-untied-biased", "phi3"])
def test_two_ranks_of_the_newer_families_give_transformers_logits(kind, tmp_path):
    """Granite's multipliers folded into each rank's shard (o_proj and down_proj are row-parallel:
    a rank's partial sum carries the residual multiplier once) and Phi-3's fused projections split
    before a rank takes its slice: two ranks give transformers' logits."""
    from tests.helpers.tiny_models import save_tiny_model

    hf = save_tiny_model(kind, tmp_path)
    prompts = [[(7 * i + 3 * n) % 120 + 5 for i in range(n)] for n in (21, 9, 34)]
    logits, _, num_kv_heads = run_tp2(tmp_path, prompts)
    assert num_kv_heads == 1  # 2 KV heads, one a rank
    with torch.inference_mode():
        want = torch.stack([hf(torch.tensor([ids])).logits[0, -1] for ids in prompts])
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
