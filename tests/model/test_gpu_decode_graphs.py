"""The GPU tier: decode steps through CUDA graphs (engine_proc/model/decode_graphs.py) on a real GPU.

Skipped without CUDA (CI has none); run on a lent GPU. The graph runner must give the eager
runner's greedy tokens while batches grow and shrink, compile once, record a CUDA graph per padded
batch size at start, and never fall back (a skipped CUDA graph would run, slower, and pass unseen).
"""
from __future__ import annotations

import random

import pytest
import torch

from rill.engine_proc.model.runner import ModelRunner
from tests.helpers.generation import BLOCK_SIZE, EOS_ID, generate
from tests.helpers.runners import make_runner as build_runner
from tests.helpers.tiny_models import save_tiny_model

pytestmark = pytest.mark.gpu
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    save_tiny_model("llama3-rope-untied", path)
    return path


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(3)
    return [[rng.randrange(3, 128) for _ in range(n)] for n in (5, 19, 33, 8, 50)]


def make_runner(path, **kw) -> ModelRunner:
    return build_runner(path, dtype=torch.float32, num_kv_blocks=64, block_size=BLOCK_SIZE, eos_token_ids=[EOS_ID],
                       device="cuda", **kw)


def test_cuda_graph_decodes_match_the_eager_runner(tiny_model_dir, prompts):
    import torch._dynamo.utils

    counters = torch._dynamo.utils.counters
    skips_before = counters["inductor"]["cudagraph_skips"]
    compiled = make_runner(tiny_model_dir, compile_decode=True, max_num_seqs=8)
    assert compiled.decode_graphs is not None, "torch.compile failed: see the warning in the log"
    assert compiled.decode_graphs.sizes == (1, 2, 4, 8)
    assert set(compiled.decode_graphs.graphs or {}) == {1, 2, 4, 8}, "CUDA graph capture failed: see the log"
    graphs_after_warm_up = counters["stats"]["unique_graphs"]
    runs = []
    run = compiled.decode_graphs.run
    compiled.decode_graphs.run = lambda batch: runs.append(batch.num_tokens) or run(batch)
    eager = make_runner(tiny_model_dir)
    arrivals = [0, 2, 3, 7, 9]  # decode-only steps of 1, 3, 4 and 5 rows (and fewer as they end): padded
    want = generate(eager, prompts, max_tokens=24, arrival_steps=arrivals)
    got = generate(compiled, prompts, max_tokens=24, arrival_steps=arrivals)
    assert got == want
    assert len(runs) >= 20 and {1, 3, 4, 5} <= set(runs)  # the decode steps went through the graphs
    assert counters["stats"]["unique_graphs"] == graphs_after_warm_up  # nothing compiled after start
    assert counters["inductor"]["cudagraph_skips"] == skips_before  # every step a CUDA graph replay


def test_bfloat16_graphs_agree_with_eager_logits(tiny_model_dir, prompts):
    """The dtype a GPU serves in: the graph's logits within bfloat16 rounding of the eager step's."""
    from rill.engine_proc.sched.batch import Batch, ScheduledSeq
    from rill.engine_proc.sched.request import EngineRequest
    from rill.ipc.protocol import SamplingParams
    from tests.helpers.generation import BlockAllocator

    logits = []
    for kw in ({"compile_decode": True, "max_num_seqs": 4}, {}):
        r = build_runner(tiny_model_dir, dtype=torch.bfloat16, num_kv_blocks=64, block_size=BLOCK_SIZE,
                        eos_token_ids=[EOS_ID], device="cuda", **kw)
        allocator = BlockAllocator(r.kv_cache.num_blocks)
        reqs = [EngineRequest(f"r{i}", "w", list(p), SamplingParams(max_tokens=4, temperature=0.0))
                for i, p in enumerate(prompts[:3])]
        for req in reqs:
            allocator.cover(req, req.num_tokens + 1)
        r.compute_logits(Batch([ScheduledSeq(q, 0, q.num_tokens - 1) for q in reqs]))
        for q in reqs:
            q.num_computed_tokens = q.num_tokens - 1
        logits.append(r.compute_logits(Batch([ScheduledSeq(q, q.num_computed_tokens, 1) for q in reqs])).float())
    torch.testing.assert_close(logits[0], logits[1], rtol=0.02, atol=0.05)
