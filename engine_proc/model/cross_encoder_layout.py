"""Reads a cross-encoder directory (a sentence-transformers `CrossEncoder`, or any Hugging Face
`*ForSequenceClassification` with one label): whether it is one, its score activation, its length limit."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

# sentence-transformers names the activation by its class (config.json's `sentence_transformers.activation_fn`,
# or the older `sbert_ce_default_activation_function`); these are the ones Rill applies.
ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.Tanh": "tanh",
}
# A tokenizer_config.json without a real limit writes a huge sentinel (int(1e30)).
_NO_LIMIT = 1 << 40


@dataclass(frozen=True)
class ScoreHead:
    """How the classifier's one logit becomes a relevance score."""

    activation: str  # sigmoid | identity | tanh: sentence-transformers' default for one label is sigmoid
    max_model_len: int | None  # the tokenizer's model_max_length, where it sets one


def is_cross_encoder(model_dir: str | Path) -> bool:
    """A directory whose config names a sequence-classification architecture with exactly one label."""
    config = _config(Path(model_dir))
    if config is None:
        return False
    architectures = config.get("architectures") or []
    return any(a.endswith("ForSequenceClassification") for a in architectures) and _num_labels(config) == 1


def read_score_head(model_dir: str | Path) -> ScoreHead:
    """The ScoreHead of a cross-encoder directory; ValueError, naming it, for an activation Rill does not apply."""
    model_dir = Path(model_dir)
    config = _config(model_dir) or {}
    named = (config.get("sentence_transformers") or {}).get("activation_fn") or \
        config.get("sbert_ce_default_activation_function")
    if named is not None and named not in ACTIVATIONS:
        raise ValueError(f"{model_dir}: score activation {named!r} not supported; Rill applies "
                         f"{', '.join(ACTIVATIONS)}")
    tokenizer_config = model_dir / "tokenizer_config.json"
    limit = json.loads(tokenizer_config.read_text()).get("model_max_length") if tokenizer_config.is_file() else None
    return ScoreHead(activation=ACTIVATIONS[named] if named else "sigmoid",
                     max_model_len=int(limit) if isinstance(limit, (int, float)) and 0 < limit < _NO_LIMIT else None)


def _num_labels(config: dict) -> int:
    if "num_labels" in config:
        return int(config["num_labels"])
    return len(config.get("id2label") or {"0": "LABEL_0", "1": "LABEL_1"})  # transformers' default is two


def _config(model_dir: Path) -> dict | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None
