"""Prompt steps padded to token and row buckets (engine_proc/model/prompt_graphs.py) against the eager runner.

On a GPU the runner captures a CUDA graph per bucket at start and the steps replay them (the GPU tier).
Without one the test builds the same padded inputs and runs the compiled prompt step on them uncaptured
(AOTAutograd without Inductor, the Triton kernels under Triton's interpreter): the padding tokens and
rows, the tiles worked out on the host and the fallback of a step larger than the largest bucket are the
GPU's.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from rill.engine_proc.model.compiled_prefill import CompiledPrefill
from rill.engine_proc.model.prompt_graphs import PromptGraphs, PromptInputs, row_buckets, token_buckets
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.protocol import SamplingParams
from tests.helpers.generation import BLOCK_SIZE, step_logits
from tests.helpers.runners import make_runner

pytest.importorskip("triton", reason="triton is not installed (pip install -e .[test] on Linux)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_buckets_cover_every_size_up_to_the_largest():
    assert token_buckets(2048)[:6] == (16, 24, 32, 48, 64, 96)
    assert token_buckets(2048)[-3:] == (1024, 1536, 2048)
    assert token_buckets(100) == (16, 24, 32, 48, 64, 96, 100)
    assert token_buckets(16) == (16,)
    assert row_buckets(256) == (1, 4, 16, 64, 256)
    assert row_buckets(48) == (1, 4, 16, 48)
    assert row_buckets(1) == (1,)


def test_padded_inputs_lay_out_the_step_and_park_the_padding_in_block_0():
    from rill.engine_proc.attention.triton import tile_lens_of

    per_tile = 4
    inputs = PromptInputs(max_tokens=32, max_rows=4, max_seqs=3, width=4, block_size=4, per_tile=per_tile,
                          device=torch.device("cpu"))
    params = SamplingParams(max_tokens=8)
    a = EngineRequest("a", "w", list(range(10, 19)), params)  # 9 tokens: a chunk of 6 after 2 cached
    a.block_ids = [5, 7, 9]
    b = EngineRequest("b", "w", [3, 4, 5], params)  # decoding: its 4th token
    b.output_ids = [6]
    b.block_ids = [2]
    batch = Batch([ScheduledSeq(a, 2, 6), ScheduledSeq(b, 3, 1)])
    inputs.fill(batch, num_tokens=16, num_rows=4)
    inputs.to_device(16, 4)
    ids, positions, meta, rows = inputs.static(16, 4)
    assert ids.tolist() == list(range(12, 18)) + [6] + [0] * 9
    assert positions.tolist() == [2, 3, 4, 5, 6, 7, 3] + [0] * 9
    assert meta.slot_mapping.tolist() == [5 * 4 + 2, 5 * 4 + 3, 7 * 4, 7 * 4 + 1, 7 * 4 + 2, 7 * 4 + 3, 2 * 4 + 3] + [0] * 9
    assert meta.seq_of_token.tolist() == [0] * 6 + [1] + [2] * 9  # the padding: a sequence of its own
    assert meta.context_lens.tolist() == [3, 4, 5, 6, 7, 8, 4] + [1] * 9
    assert meta.tile_lens.tolist() == tile_lens_of(meta.seq_of_token, per_tile).tolist()
    assert meta.block_tables[0, :2].tolist() == [5, 7] and meta.block_tables[1, 0] == 2
    assert meta.block_tables[2, 0] == 0  # the padding's block: the null block
    assert rows.tolist() == [6, 0, 0, 0]  # b's row is sampled; a's chunk does not end its prompt
    np.testing.assert_array_equal(meta.tile_lens.numpy()[:7], [4, 0, 0, 0, 2, 0, 1])


def test_prompt_steps_through_the_buckets_match_the_eager_runner(tiny_model_dir):
    rng = random.Random(3)
    prompts = [[rng.randrange(3, 128) for _ in range(n)] for n in (20, 37, 9, 3, 26)]
    make = lambda **kw: make_runner(tiny_model_dir, num_kv_blocks=48, block_size=BLOCK_SIZE,  # noqa: E731
                                    eos_token_ids=[2], device=DEVICE, attention_backend="triton", **kw)
    eager = make()
    graphed = make(compile_decode=DEVICE == "cuda")  # on a GPU the runner captures them; here the test builds them
    if DEVICE == "cpu":
        prefill = CompiledPrefill(graphed.model, graphed.kv_cache, graphed.device, "aot_eager")
        prefill.warm_up()
        # Buckets of 16 and 24 tokens: a step of more goes through the compiled step alone.
        graphed.prompt_graphs = PromptGraphs(prefill, BLOCK_SIZE, 8, 24, 256, graphed.device)
        graphed.compiled_prefill = prefill
    assert graphed.prompt_graphs is not None, "a CUDA graph capture failed on the GPU: see the warning in the log"
    bucketed, unbucketed = [], []
    run, fallback = graphed.prompt_graphs.run, graphed.compiled_prefill.run
    graphed.prompt_graphs.run = lambda batch: bucketed.append(batch.num_tokens) or run(batch)
    graphed.compiled_prefill.run = lambda *args: unbucketed.append(args[0].shape[0]) or fallback(*args)
    # Chunks of 16 mixed with decodes as requests arrive: steps of 5 to 26 tokens
    got, got_tokens = step_logits(graphed, prompts, chunk_len=16, num_steps=7)
    want, want_tokens = step_logits(eager, prompts, chunk_len=16, num_steps=7)
    for step, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")
    assert got_tokens == want_tokens
    if DEVICE == "cpu":
        assert len({n for n in bucketed if n <= 24}) >= 4  # steps of several sizes padded to a bucket
        assert unbucketed == [26]  # and the one larger than the largest bucket fell back


def test_a_graph_that_replays_wrong_is_dropped_at_start(tiny_model_dir):
    """The start check (PromptGraphs._check): a replay must give the compiled step's logits; here the
    graphs are stand-ins that do (the step itself) and do not (nothing), as a capture is GPU-only."""
    runner = make_runner(tiny_model_dir, num_kv_blocks=8, block_size=BLOCK_SIZE, eos_token_ids=[2],
                         attention_backend="triton")
    prefill = CompiledPrefill(runner.model, runner.kv_cache, runner.device, "aot_eager")
    graphs = PromptGraphs(prefill, BLOCK_SIZE, 4, 32, 64, runner.device)

    class Replays:
        def __init__(self, step):
            self.replay = step

    graphs.graphs = {(16, 1): Replays(lambda: graphs._forward(16, 1))}
    graphs._check(Batch())
    assert graphs.graphs
    graphs.graphs = {(16, 1): Replays(lambda: None)}
    with pytest.raises(RuntimeError, match="does not give the compiled step's logits"):
        graphs._check(Batch())
    assert not graphs.graphs  # the runner then serves the compiled step alone
