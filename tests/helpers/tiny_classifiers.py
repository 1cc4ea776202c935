"""Tiny random-weight sequence classifiers and transformers' own logits for them: a BERT of three labels with
all-MiniLM-L6-v2's WordPiece tokenizer, and a Llama with a `score` head (a decoder classifier, or with one label a
reward model) with the bundled model's tokenizer and no pad token."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from tests.helpers.tiny_rerankers import MAX_POSITIONS, TOKENIZER_FILES, minilm_dir, save_wide

LABELS = ("negative", "neutral", "positive")


def save_tiny_text_classifier(path: Path, problem_type: str | None = None) -> Path:
    """A BertForSequenceClassification of LABELS; `problem_type` as transformers writes it."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(1)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
                        id2label=dict(enumerate(LABELS)), label2id={k: i for i, k in enumerate(LABELS)},
                        initializer_range=0.5, problem_type=problem_type)
    BertForSequenceClassification(config).eval().save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, path / name)
    return path


def save_tiny_decoder_classifier(path: Path, num_labels: int = 2) -> Path:
    """A LlamaForSequenceClassification over the bundled model's vocabulary, without a pad token."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    torch.manual_seed(2)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=1, eos_token_id=2, pad_token_id=None, num_labels=num_labels)
    return save_wide(LlamaForSequenceClassification(config).eval(), path)


def reference_class_logits(model_dir: Path, texts: list[str]) -> torch.Tensor:
    """transformers' forward over each text alone, tokenized by its own tokenizer: [len(texts), labels]."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.inference_mode():
        return torch.cat([model(**tokenizer(text, return_tensors="pt")).logits for text in texts])
