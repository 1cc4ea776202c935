"""Scores whole prompts with a decoder reranker (Qwen3-Reranker's recipe): the last token's logit of "yes"
against "no", one relevance score per finished prompt."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from rill.engine_proc.model.hf_runner import KVBudget
from rill.engine_proc.model.runner_api import RunnerInfo
from rill.engine_proc.model.scoring_runner import ScoringRunner
from rill.ipc.config import ModelConfig

log = logging.getLogger("rill.model")


def answer_id(tokenizer: Tokenizer, word: str) -> int:
    """The vocabulary's one token for `word`; ValueError where it takes several (no yes/no reranker then)."""
    if (token_id := tokenizer.token_to_id(word)) is not None:
        return token_id
    ids = tokenizer.encode(word, add_special_tokens=False).ids
    if len(ids) != 1:
        raise ValueError(f"--task score on a decoder needs {word!r} as one token; this tokenizer makes {len(ids)}")
    return ids[0]


class YesNoRunner(ScoringRunner):
    """The `Runner` protocol for a decoder served as a reranker: `execute(batch)` is one engine step.

    A reranker reads each prompt once and keeps nothing, so, as the encoder runners do, it runs each
    prompt whole at its last chunk, with no KV cache: prompts left-padded into groups, positions
    counted from each one's first real token, and only the last position's logits made. Its
    "embedding" is two float32s, [sigmoid(yes - no), yes - no]: softmax over the two logits, and the
    logit a classifier converted from the two (vLLM's `classifier_from_token`) would give.
    """

    info = RunnerInfo("yes-no reranker")

    def __init__(self, model: ModelConfig, *, dtype: torch.dtype, device: torch.device | str, num_kv_blocks: int) -> None:
        model_dir = Path(model.model_dir)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.yes_id, self.no_id = answer_id(tokenizer, "yes"), answer_id(tokenizer, "no")
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
        self.model = self.model.to(self.device).eval().requires_grad_(False)
        self.config = self.model.config.get_text_config()
        self.vocab_size: int = self.config.vocab_size
        self.max_model_len: int = getattr(self.config, "max_position_embeddings", None) or num_kv_blocks * model.block_size
        self.kv_cache = KVBudget(num_blocks=num_kv_blocks, block_size=model.block_size, num_bytes=0)
        log.info("yes/no reranker: ids %d (yes) and %d (no), max_model_len %d", self.yes_id, self.no_id,
                 self.max_model_len)

    @torch.inference_mode()
    def _score_group(self, prompts: list[list[int]]) -> np.ndarray:
        """[len(prompts), 2] float32: the prompts left-padded into one forward, the last position's logits."""
        max_len = max(len(p) for p in prompts)
        input_ids = torch.zeros((len(prompts), max_len), dtype=torch.long)
        mask = torch.zeros((len(prompts), max_len), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, max_len - len(ids):] = torch.tensor(ids, dtype=torch.long)
            mask[row, max_len - len(ids):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=input_ids.to(self.device), attention_mask=mask.to(self.device),
                            position_ids=positions.to(self.device), logits_to_keep=1).logits[:, -1].float()
        margin = logits[:, self.yes_id] - logits[:, self.no_id]
        return torch.stack([torch.sigmoid(margin), margin], dim=1).cpu().numpy()
