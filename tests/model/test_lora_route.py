"""LoRA adapters on the paged transformers route (Gemma 2 and 3, a windowed Mistral, OLMo 2, the attention of
Qwen3-MoE, Mixtral and GPT-OSS): PEFT adapters of tiny random models, several in one batch with the base model,
through the real scheduler; each
request's greedy tokens equal those of PEFT's merged model of its adapter, and each step's rows its logits. An
adapter of a mixture of experts' MLP is refused, naming the layer."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from rill.bench.features.lora_adapters import make_adapter
from rill.engine_proc.lora.adapter import AdapterError, module_shapes
from rill.engine_proc.model.hf_paged import PagedTransformersRunner
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.request import EngineRequest
from rill.engine_proc.sched.scheduler import Scheduler
from rill.engine_proc.sched.window_tables import window_tables_of
from rill.ipc.protocol import SamplingParams
from tests.helpers.runners import make_runner
from tests.helpers.tiny_models import save_tiny_model

BLOCK, NEW = 4, 6
PROMPTS = [[5, 17, 42, 9, 77, 3, 61], [8, 8, 30], [99, 12, 45, 70, 2, 1, 66, 20, 13, 54, 7]]
ATTENTION, ALL = ["q_proj", "k_proj", "v_proj", "o_proj"], ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                           "down_proj"]
KINDS = {"gemma2": ALL, "gemma3_text": ALL, "mistral-window": ALL, "olmo2": ALL, "qwen3_moe": ATTENTION,
         "mixtral": ATTENTION, "gpt_oss": ATTENTION}


def greedy(model, prompt: list[int]) -> list[int]:
    """transformers' greedy tokens, each from a forward over the whole sequence (no end token stops it)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_request_gets_its_adapters_tokens(kind, tmp_path):
    base = save_tiny_model(kind, tmp_path / "model")
    adapters = {}
    for seed, targets in enumerate([KINDS[kind], KINDS[kind][-2:]]):
        path, merged = make_adapter(tmp_path / "model", tmp_path / f"a{seed}", 4, 8, targets, seed, b_std=1.0)
        adapters[f"a{seed}"] = (path, merged)
    runner = make_runner(tmp_path / "model", runner_class=PagedTransformersRunner, num_kv_blocks=64,
                         block_size=BLOCK, eos_token_ids=[], max_loras=2, max_lora_rank=8)
    for name, (path, _) in adapters.items():
        runner.lora.load(name, str(path))
    items = [(p, name) for name in [*adapters, ""] for p in PROMPTS]
    expected = [greedy(adapters[name][1] if name else base, p) for p, name in items]
    with torch.no_grad():  # the adapters move the logits (a tiny Gemma's greedy tokens repeat the last one anyway)
        logits = [m(torch.tensor([PROMPTS[0]])).logits[0, -1] for m in (base, *(m for _, m in adapters.values()))]
    assert all((other - logits[0]).abs().max() > 0.05 for other in logits[1:]), "an adapter changes nothing"
    blocks = BlockManager(64, BLOCK, sliding_window=runner.sliding_window, window=window_tables_of(runner))
    sched = Scheduler(blocks, max_num_seqs=16, max_num_batched_tokens=256, max_model_len=128, eos_token_ids=[])
    order = sorted(range(len(items)), key=lambda i: (i * 5) % len(items))  # adapters' rows interleave in a step
    reqs = [EngineRequest(f"r{i}", "w", list(items[i][0]), SamplingParams(max_tokens=NEW, temperature=0.0,
                                                                           lora=items[i][1])) for i in order]
    models = {name: merged for name, (_, merged) in adapters.items()} | {"": base}
    mismatches, compute_logits = [], type(runner).compute_logits

    def checked(batch, *args, **kwargs):  # each sampled row against its own adapter's merged model
        logits = compute_logits(runner, batch, *args, **kwargs)
        with torch.inference_mode():
            for row, seq in zip(logits, batch.sampled_seqs):
                ids = seq.req.token_ids(0, seq.start_pos + seq.num_new_tokens)
                expected = models[seq.req.lora](torch.tensor([ids])).logits[0, -1]
                if not torch.allclose(row.float(), expected, atol=1e-4, rtol=1e-4):
                    mismatches.append(f"{seq.req.req_id} ({seq.req.lora or 'base'}) at {len(ids)} tokens")
        return logits

    runner.compute_logits = checked
    for r in reqs:
        sched.add(r)
    while sched.has_work:
        batch = sched.schedule()
        sched.update(batch, runner.execute(batch))
    assert mismatches == []
    assert [reqs[order.index(i)].output_ids for i in range(len(items))] == expected


def test_an_adapter_of_experts_mlp_is_refused_naming_the_layer(tmp_path):
    """Written by hand: PEFT itself finds no gate_proj linear in the experts either."""
    hf = save_tiny_model("qwen3_moe", tmp_path / "model")
    shapes = module_shapes(hf.config)
    tensors = {}
    for module in ("q_proj", "gate_proj"):
        part = "mlp" if module == "gate_proj" else "self_attn"
        key = f"base_model.model.model.layers.0.{part}.{module}"
        tensors[f"{key}.lora_A.weight"] = torch.randn(4, shapes[module][0])
        tensors[f"{key}.lora_B.weight"] = torch.randn(shapes[module][1], 4)
    path = tmp_path / "mlp"
    path.mkdir()
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4, "lora_alpha": 8}))
    runner = make_runner(tmp_path / "model", runner_class=PagedTransformersRunner, num_kv_blocks=16,
                         block_size=BLOCK, eos_token_ids=[], max_loras=1, max_lora_rank=8)
    with pytest.raises(AdapterError, match="has no gate_proj linear"):
        runner.lora.load("mlp", str(path))
    assert runner.lora.slots == {}
