"""LoRA adapters made with PEFT over the bundled model (non-zero B, so they change the output):
Rill's greedy tokens equal those of PEFT's merged model, alone and in a batch mixing three
adapters and the base model; bad adapters are refused with a message naming what is wrong.
The model is the bundled one's first 4 layers and its head (`short_model_dir`): every module an adapter
targets, at a fifth of the cost of building and running PEFT's merged models of all 30."""
from __future__ import annotations

import json

import pytest
import torch

from rill.bench.features.lora_adapters import make_adapter
from rill.engine_proc.lora.adapter import AdapterError
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc.protocol import SamplingParams
from tests.helpers.adapters import ADAPTERS
from tests.helpers.generation import BLOCK_SIZE, EOS_ID, hf_greedy
from tests.helpers.runners import make_runner

NUM_NEW = 12


@pytest.fixture(scope="module")
def base_tokens(short_model_dir, prompts) -> list[list[int]]:
    """transformers' greedy tokens of the model without an adapter."""
    from transformers import AutoModelForCausalLM

    return hf_greedy(AutoModelForCausalLM.from_pretrained(short_model_dir, dtype=torch.float32).eval(), prompts, NUM_NEW)


@pytest.fixture(scope="module")
def adapters(short_model_dir, prompts, tmp_path_factory):
    """name -> (dir, the merged model's greedy tokens for each prompt)."""
    out = {}
    for seed, (name, (rank, alpha, targets)) in enumerate(ADAPTERS.items()):
        path, merged = make_adapter(short_model_dir, tmp_path_factory.mktemp(name), rank, alpha, targets, seed)
        out[name] = (path, hf_greedy(merged, prompts, NUM_NEW))
    return out


@pytest.fixture(scope="module")
def lora_runner(short_model_dir, adapters) -> ModelRunner:
    runner = make_runner(short_model_dir, dtype=torch.float32, num_kv_blocks=64, block_size=BLOCK_SIZE,
                         eos_token_ids=[EOS_ID], max_loras=3, max_lora_rank=16)
    for name, (path, _) in adapters.items():
        runner.lora.load(name, str(path))
    return runner


def run(runner, items: list[tuple[list[int], str]]) -> list[list[int]]:
    """Greedy, every (prompt, adapter) in one running batch, through a real scheduler."""
    sched = Scheduler(BlockManager(runner.kv_cache.num_blocks, BLOCK_SIZE), max_num_seqs=16,
                      max_num_batched_tokens=1024, max_model_len=1024, eos_token_ids=[EOS_ID])
    reqs = [EngineRequest(f"r{i}", "w", list(p), SamplingParams(max_tokens=NUM_NEW, temperature=0.0,
                                                                min_tokens=NUM_NEW, lora=lora))
            for i, (p, lora) in enumerate(items)]
    for r in reqs:
        sched.add(r)
    while sched.has_work:
        batch = sched.schedule()
        sched.update(batch, runner.execute(batch))
    return [r.output_ids for r in reqs]


def test_each_adapter_gives_the_merged_models_tokens(lora_runner, adapters, prompts, base_tokens):
    for name, (_, expected) in adapters.items():
        assert run(lora_runner, [(p, name) for p in prompts]) == expected, name
        assert expected != base_tokens, f"adapter {name} changes nothing"


def test_a_batch_mixing_three_adapters_and_the_base_gives_each_row_its_own(lora_runner, adapters, prompts,
                                                                            base_tokens):
    items = [(p, name) for name in [*ADAPTERS, ""] for p in prompts]
    expected = [adapters[name][1][i] if name else base_tokens[i]
                for name in [*ADAPTERS, ""] for i in range(len(prompts))]
    # Shuffled, so adapters' rows interleave in the step (decodes first, then prompts).
    order = sorted(range(len(items)), key=lambda i: (i * 7) % len(items))
    out = run(lora_runner, [items[i] for i in order])
    assert [out[order.index(i)] for i in range(len(items))] == expected


def test_unload_frees_the_slot_for_another(lora_runner, adapters, prompts):
    path, expected = adapters["mlp"]
    lora_runner.lora.unload("mlp")
    with pytest.raises(AdapterError, match="not loaded"):
        lora_runner.lora.unload("mlp")
    lora_runner.lora.load("mlp2", str(path))
    assert run(lora_runner, [(prompts[0], "mlp2")]) == [expected[0]]
    with pytest.raises(AdapterError, match="--max-loras 3"):
        lora_runner.lora.load("fourth", str(path))
    lora_runner.lora.unload("mlp2")
    lora_runner.lora.load("mlp", str(path))


def test_bad_adapters_are_refused_naming_why(lora_runner, short_model_dir, adapters, tmp_path):
    load = lora_runner.lora.load
    lora_runner.lora.unload("mlp")  # a free slot: what is refused is the adapter, not the lack of room
    with pytest.raises(AdapterError, match="is not a PEFT adapter directory"):
        load("x", str(tmp_path))
    with pytest.raises(AdapterError, match="already loaded"):
        load("attn", str(adapters["attn"][0]))
    big, _ = make_adapter(short_model_dir, tmp_path / "big", 32, 32, ["q_proj"], 9)
    with pytest.raises(AdapterError, match="rank 32 is above --max-lora-rank 16"):
        load("big", str(big))
    head, _ = make_adapter(short_model_dir, tmp_path / "head", 4, 4, ["q_proj", "lm_head"], 9)
    with pytest.raises(AdapterError, match="not a LoRA A or B of a supported module"):
        load("head", str(head))
    dora = tmp_path / "dora"
    dora.mkdir()
    (dora / "adapter_model.safetensors").write_bytes((adapters["attn"][0] / "adapter_model.safetensors").read_bytes())
    config = json.loads((adapters["attn"][0] / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    with pytest.raises(AdapterError, match="DoRA"):
        load("dora", str(dora))
    assert set(lora_runner.lora.slots) == set(ADAPTERS) - {"mlp"}  # nothing half-loaded
    load("mlp", str(adapters["mlp"][0]))
