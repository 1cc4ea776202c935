"""What a server does with its model (`--task`, or the model directory): generate, embed, score pairs, or classify."""
from __future__ import annotations

import enum
from pathlib import Path

from rill.engine_proc.model.cross_encoder_layout import num_labels
from rill.engine_proc.model.sentence_layout import is_sentence_transformers

TASKS = ("auto", "generate", "embed", "score", "classify")  # --task's choices


class Served(enum.Enum):
    """The engine a server runs, and so the endpoints it answers."""

    GENERATE = "generate"  # a decoder: every generating route (and /v1/embeddings with --enable-embeddings)
    EMBED = "embed"  # a sentence-transformers encoder: /v1/embeddings only
    CROSS_ENCODER = "cross-encoder"  # a one-label sequence classifier: /rerank and /score only
    YES_NO = "yes-no"  # a decoder reranker (Qwen3-Reranker's recipe): /rerank and /score only
    CLASSIFY = "classify"  # a sequence classifier (several labels, or --task classify): /classify only


def choose_served(task: str, model_dir: str | Path) -> Served:
    """`task` (one of TASKS) on `model_dir`; ValueError, saying why, where the two disagree."""
    labels = num_labels(model_dir)
    if labels == 1:  # a cross-encoder, or a reward model (a decoder scoring one text) with --task classify
        layout, fits = Served.CROSS_ENCODER, ("auto", "score", "classify")
    elif labels:
        layout, fits = Served.CLASSIFY, ("auto", "classify")
    elif is_sentence_transformers(model_dir):
        layout, fits = Served.EMBED, ("auto", "embed")
    else:
        layout, fits = Served.GENERATE, ("auto", "generate", "score")
    if task not in fits:
        what = {Served.CROSS_ENCODER: "a one-label classifier, which serves --task score (a cross-encoder) or "
                                      "classify",
                Served.CLASSIFY: f"a sequence classifier of {labels} labels, which serves --task classify",
                Served.EMBED: "a sentence-transformers embedding model, which serves --task embed",
                Served.GENERATE: "a decoder, which serves --task generate, or score as a yes/no reranker (use "
                                 "--enable-embeddings for its embeddings)"}[layout]
        raise ValueError(f"--task {task}: {model_dir} is {what}")
    if layout is Served.GENERATE and task == "score":
        return Served.YES_NO
    return Served.CLASSIFY if task == "classify" else layout
