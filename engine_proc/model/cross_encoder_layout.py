"""Reads a sequence classifier's directory (a sentence-transformers `CrossEncoder`, or any Hugging Face
`*ForSequenceClassification`): whether it is one, how many labels, its activation, its labels, its length limit."""
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
MAX_LABELS = 4096  # a classifier's labels: each request's answer carries one probability a label


@dataclass(frozen=True)
class ScoreHead:
    """How the classifier's logits become scores (a cross-encoder's relevance, a classifier's probabilities)."""

    # sigmoid | identity | tanh | softmax (over the labels). sentence-transformers' default for one label is
    # sigmoid; with several, transformers' problem_type decides as its loss does (vLLM's rule): softmax for one
    # label of many, sigmoid for multi-label, identity for regression.
    activation: str
    max_model_len: int | None  # the tokenizer's model_max_length, where it sets one
    labels: tuple[str, ...] = ("LABEL_0",)  # id2label, in the logits' order


def num_labels(model_dir: str | Path) -> int:
    """The labels of a directory whose config names a sequence-classification architecture; 0 for any other."""
    config = _config(Path(model_dir))
    if config is None:
        return 0
    architectures = config.get("architectures") or []
    return _num_labels(config) if any(a.endswith("ForSequenceClassification") for a in architectures) else 0


def is_cross_encoder(model_dir: str | Path) -> bool:
    """A directory whose config names a sequence-classification architecture with exactly one label."""
    return num_labels(model_dir) == 1


def read_score_head(model_dir: str | Path) -> ScoreHead:
    """The ScoreHead of a classifier's directory; ValueError, naming it, for an activation Rill does not apply."""
    model_dir = Path(model_dir)
    config = _config(model_dir) or {}
    named = (config.get("sentence_transformers") or {}).get("activation_fn") or \
        config.get("sbert_ce_default_activation_function")
    if named is not None and named not in ACTIVATIONS:
        raise ValueError(f"{model_dir}: score activation {named!r} not supported; Rill applies "
                         f"{', '.join(ACTIVATIONS)}")
    count = _num_labels(config)
    id2label = config.get("id2label") or {}
    labels = tuple(str(id2label.get(str(i), id2label.get(i, f"LABEL_{i}"))) for i in range(count))
    problem = config.get("problem_type")
    if named:
        activation = ACTIVATIONS[named]
    elif problem == "regression":
        activation = "identity"
    elif problem == "multi_label_classification" or count == 1:
        activation = "sigmoid"
    else:
        activation = "softmax"
    tokenizer_config = model_dir / "tokenizer_config.json"
    limit = json.loads(tokenizer_config.read_text()).get("model_max_length") if tokenizer_config.is_file() else None
    return ScoreHead(activation=activation, labels=labels,
                     max_model_len=int(limit) if isinstance(limit, (int, float)) and 0 < limit < _NO_LIMIT else None)


def _num_labels(config: dict) -> int:
    if "num_labels" in config:
        count = int(config["num_labels"])
    else:
        count = len(config.get("id2label") or {"0": "LABEL_0", "1": "LABEL_1"})  # transformers' default is two
    if not 1 <= count <= MAX_LABELS:
        raise ValueError(f"a sequence classifier with {count} labels; Rill serves 1 to {MAX_LABELS}")
    return count


def _config(model_dir: Path) -> dict | None:
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return config if isinstance(config, dict) else None
