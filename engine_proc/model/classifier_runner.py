"""Runs a sequence classifier over whole prompts: a cross-encoder's (query, document) pairs, one relevance score
each, or a classifier's texts (`/classify`), one score per label each."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForSequenceClassification

from rill.engine_proc.model.cross_encoder_layout import ScoreHead, read_score_head
from rill.engine_proc.model.hf_runner import KVBudget
from rill.engine_proc.model.runner_api import RunnerInfo
from rill.engine_proc.model.scoring_runner import ScoringRunner
from rill.ipc.config import ModelConfig
from rill.ipc.pair_segments import pair_separator, second_segment_start

log = logging.getLogger("rill.model")

_ACTIVATIONS = {"sigmoid": torch.sigmoid, "identity": lambda x: x, "tanh": torch.tanh,
                "softmax": lambda x: torch.softmax(x, dim=-1)}


class ClassifierRunner(ScoringRunner):
    """The `Runner` protocol for a `*ForSequenceClassification` model: `execute(batch)` is one engine step.

    With `pairs`, each prompt is a pair the API worker encoded with the tokenizer's pair template (a
    cross-encoder); without, a text alone (token types all 0, as transformers gives one text). As with the
    EncoderRunner, a prompt runs whole at its last chunk, and no KV cache exists. Its "embedding" is 2N float32s
    for N labels: the activated scores, then the raw logits, so a request's `use_activation: false` is the
    worker's choice and costs the engine nothing; a cross-encoder's is [score, logit].

    A decoder's classifier (Llama's, Qwen's: a `score` head) reads each prompt's last token. transformers finds
    it by the pad token, and refuses a batch when the config names none; here the base model's hidden states
    are taken at each prompt's own last position, whatever its pad token.
    """

    info = RunnerInfo("classifier")

    def __init__(self, model: ModelConfig, *, dtype: torch.dtype, device: torch.device | str, num_kv_blocks: int,
                 pairs: bool = True) -> None:
        model_dir = Path(model.model_dir)
        self.head: ScoreHead = read_score_head(model_dir)
        self.device = torch.device(device)
        self.model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True)
        self.model = self.model.to(self.device).eval().requires_grad_(False)
        self.config = self.model.config
        self.vocab_size: int = self.config.vocab_size
        limits = [self.head.max_model_len, getattr(self.config, "max_position_embeddings", None)]
        self.max_model_len: int = min([n for n in limits if n] or [num_kv_blocks * model.block_size])
        self.kv_cache = KVBudget(num_blocks=num_kv_blocks, block_size=model.block_size, num_bytes=0)
        self._pad_id = getattr(self.config, "pad_token_id", None) or 0
        # Token types only where the model has them and the tokenizer's pairs use them (BERT's; not RoBERTa's).
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        separator = pair_separator(tokenizer)
        self._separator = separator if pairs and getattr(self.config, "type_vocab_size", 1) > 1 else None
        self._activate = _ACTIVATIONS[self.head.activation]
        self._last_token_head = getattr(self.model, "score", None)  # a decoder's, read at the last token
        log.info("%s: %d labels, %s, token types %s, max_model_len %d", "cross-encoder" if pairs else "classifier",
                 len(self.head.labels), self.head.activation,
                 "after separator id %d" % self._separator if self._separator is not None else "off", self.max_model_len)

    @torch.inference_mode()
    def _score_group(self, prompts: list[list[int]]) -> np.ndarray:
        """[len(prompts), 2N] float32: the prompts right-padded into one forward."""
        max_len = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), max_len), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), max_len), dtype=torch.long)
        types = torch.zeros((len(prompts), max_len), dtype=torch.long)
        for row, ids in enumerate(prompts):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
            if self._separator is not None:
                types[row, second_segment_start(ids, self._separator) : len(ids)] = 1
        inputs = {"input_ids": input_ids, "attention_mask": mask}
        if self._separator is not None:
            inputs["token_type_ids"] = types
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        if self._last_token_head is None:
            logits = self.model(**inputs).logits.float()
        else:  # right padding leaves a causal model's real tokens as they are
            hidden = self.model.base_model(**inputs).last_hidden_state
            last = torch.tensor([len(p) - 1 for p in prompts], device=hidden.device)
            logits = self._last_token_head(hidden[torch.arange(len(prompts), device=hidden.device), last]).float()
        return torch.cat([self._activate(logits), logits], dim=1).cpu().numpy()
