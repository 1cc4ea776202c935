"""LoRA adapters of the bundled model made with PEFT (random A, non-zero B so they change the output),
for the tests and `bench.features.lora`; nothing downloaded. Needs `peft` (the test extra)."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


def make_adapter(model_dir, out_dir, rank: int, alpha: int, targets: list[str], seed: int, b_std: float = 0.04,
                 **extra):
    """A PEFT adapter of `model_dir` saved in `out_dir`, B drawn with `b_std`; returns (out_dir, its merged model)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    peft_model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, **extra))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # PEFT starts B at zero: the adapter would change nothing
                p.normal_(0.0, b_std)
    peft_model.save_pretrained(out_dir)
    return Path(out_dir), peft_model.merge_and_unload().eval()
