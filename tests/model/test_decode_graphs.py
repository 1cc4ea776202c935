"""Compiled decode steps (engine_proc/model/decode_graphs.py): the same greedy tokens as transformers, through the graph.
The model is the bundled one's first layers (and its head: `short_model_dir`): the same operators in a graph a
seventh the size, whose compile at setup took 50 s of a worker with all 30 layers on a Zen 4."""
from __future__ import annotations

import pytest
import torch

from rill.engine_proc.model.runner import ModelRunner
from tests.helpers.generation import BLOCK_SIZE, EOS_ID, generate, hf_greedy
from tests.helpers.runners import make_runner


@pytest.fixture(scope="module")
def short_tokens(short_model_dir, prompts) -> list[list[int]]:
    from transformers import AutoModelForCausalLM

    return hf_greedy(AutoModelForCausalLM.from_pretrained(short_model_dir, dtype=torch.float32).eval(), prompts)


@pytest.fixture(scope="module")
def compiled(short_model_dir) -> ModelRunner:
    runner = make_runner(short_model_dir, dtype=torch.float32, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], compile_decode=True, max_num_seqs=8)
    assert runner.decode_graphs is not None, "torch.compile failed: see the warning in the log"
    graphs = runner.decode_graphs
    graphs.num_runs = 0
    run = graphs.run

    def counted(batch):
        graphs.num_runs += 1
        return run(batch)

    graphs.run = counted
    return runner


def test_batched_decodes_match_transformers(compiled, prompts, short_tokens):
    before = compiled.decode_graphs.num_runs
    assert generate(compiled, prompts) == short_tokens
    assert compiled.decode_graphs.num_runs - before >= 10  # the decode steps went through the graph


def test_arrivals_change_the_batch_size_and_match(compiled, prompts, short_tokens):
    """Requests join mid-way: decode-only steps of 1, 2, 3 rows through one graph, prefills eagerly."""
    assert generate(compiled, prompts, arrival_steps=[0, 3, 5][: len(prompts)]) == short_tokens[: len(prompts)]


def test_one_token_prompt_chunks_are_computed_but_not_sampled(compiled, prompts, short_tokens):
    """chunk_len 1 makes every prompt token a one-token step: the graph runs rows it must not sample."""
    before = compiled.decode_graphs.num_runs
    assert generate(compiled, prompts[:2], chunk_len=1) == short_tokens[:2]
    assert compiled.decode_graphs.num_runs - before > max(map(len, prompts[:2]))  # steps, not tokens


def test_the_graph_and_the_eager_step_agree_on_logits(compiled, short_runner, prompts):
    """Same decode step, both paths: float32 logits within fused-op rounding."""
    from rill.engine_proc.sched.batch import Batch, ScheduledSeq
    from rill.engine_proc.sched.request import EngineRequest
    from rill.ipc.protocol import SamplingParams
    from tests.helpers.generation import BlockAllocator

    logits = []
    for r in (compiled, short_runner):
        allocator = BlockAllocator(r.kv_cache.num_blocks)
        reqs = [EngineRequest(f"r{i}", "w", list(p), SamplingParams(max_tokens=4, temperature=0.0))
                for i, p in enumerate(prompts)]
        for req in reqs:
            allocator.cover(req, req.num_tokens + 1)
        r.compute_logits(Batch([ScheduledSeq(q, 0, q.num_tokens - 1) for q in reqs]))  # all but the last token
        for q in reqs:
            q.num_computed_tokens = q.num_tokens - 1
        logits.append(r.compute_logits(Batch([ScheduledSeq(q, q.num_computed_tokens, 1) for q in reqs])))
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=2e-3)


def test_drafts_run_as_rows_of_the_graph(compiled, short_runner, model_dir):
    """Speculative decoding: a decode and its drafts are rows of one graph step (each its own
    position, the same blocks): the same greedy tokens as the eager step without drafts."""
    from transformers import AutoTokenizer

    from rill.ipc.protocol import SamplingParams
    from tests.helpers.speculative import COPY, ngram, serve

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [list(tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=True)["input_ids"])
               for m in [COPY, "Write a haiku about the sea."]]
    params = SamplingParams(max_tokens=32, temperature=0.0, min_tokens=32)
    plain, _, _ = serve(short_runner, prompts, params)
    speculator = ngram()
    before = compiled.decode_graphs.num_runs
    spec, _, steps = serve(compiled, prompts, params, speculator)
    assert spec == plain
    assert speculator.stats.num_accepted_tokens > 0
    assert compiled.decode_graphs.num_runs - before >= steps - 2  # every step but the prefill



def test_no_batch_size_compiles_a_new_graph(tmp_path):
    """On the CPU one graph takes every batch size (dynamic shapes, compiled at start): steps of sizes
    not seen at start must not recompile it (a check of the step's metadata in the model's forward
    once did, 13 s a size for the bundled model). bfloat16, as `--dtype auto` picks on most CPUs."""
    import torch._dynamo.utils
    from transformers import AutoModelForCausalLM, LlamaConfig

    from rill.engine_proc.sched.batch import Batch, ScheduledSeq
    from rill.engine_proc.sched.request import EngineRequest
    from rill.ipc.protocol import SamplingParams
    from tests.helpers.generation import BlockAllocator

    config = LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    compiled = make_runner(tmp_path, dtype=torch.bfloat16, num_kv_blocks=32, block_size=BLOCK_SIZE,
                           eos_token_ids=[EOS_ID], compile_decode=True, max_num_seqs=8)
    assert compiled.decode_graphs is not None
    allocator = BlockAllocator(compiled.kv_cache.num_blocks)
    reqs = [EngineRequest(f"g{i}", "w", list(range(3, 13 + i)), SamplingParams(max_tokens=4)) for i in range(8)]
    for req in reqs:
        allocator.cover(req, req.num_tokens)
        req.num_computed_tokens = req.num_tokens - 1  # the KV before it need not be real here
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for size in (1, 2, 5, 8):
        batch = Batch([ScheduledSeq(r, r.num_computed_tokens, 1) for r in reqs[:size]])
        assert compiled.decode_graphs.can_run(batch)
        compiled.compute_logits(batch)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_a_cpp_wrapper_that_fails_to_compile_leaves_the_python_wrapper(compiled, monkeypatch):
    """The decode graph goes through Inductor's C++ wrapper; where that compile fails the runner compiles with the
    Python wrapper, and only then serves eagerly. The class is the edge replaced: it fails for the C++ wrapper."""
    from rill.engine_proc.model import runner as runner_module

    tried = []

    class Graphs:
        def __init__(self, *args, cpp_wrapper: bool):
            tried.append(cpp_wrapper)
            self.cpp_wrapper = cpp_wrapper

        def warm_up(self):
            if self.cpp_wrapper:
                raise RuntimeError("an operator the C++ wrapper cannot call")

    monkeypatch.setattr(runner_module, "DecodeGraphs", Graphs)
    graphs = compiled._compiled_decode(4, 512)
    assert tried == [True, False] and graphs.cpp_wrapper is False
