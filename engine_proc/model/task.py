"""What a server does with its model (`--task`, or the model directory): generate, embed, or score pairs."""
from __future__ import annotations

import enum
from pathlib import Path

from rill.engine_proc.model.cross_encoder_layout import is_cross_encoder
from rill.engine_proc.model.sentence_layout import is_sentence_transformers

TASKS = ("auto", "generate", "embed", "score")  # --task's choices


class Served(enum.Enum):
    """The engine a server runs, and so the endpoints it answers."""

    GENERATE = "generate"  # a decoder: every generating route (and /v1/embeddings with --enable-embeddings)
    EMBED = "embed"  # a sentence-transformers encoder: /v1/embeddings only
    CROSS_ENCODER = "cross-encoder"  # a one-label sequence classifier: /rerank and /score only
    YES_NO = "yes-no"  # a decoder reranker (Qwen3-Reranker's recipe): /rerank and /score only


def choose_served(task: str, model_dir: str | Path) -> Served:
    """`task` (one of TASKS) on `model_dir`; ValueError, saying why, where the two disagree."""
    if is_cross_encoder(model_dir):
        layout, fits = Served.CROSS_ENCODER, ("auto", "score")
    elif is_sentence_transformers(model_dir):
        layout, fits = Served.EMBED, ("auto", "embed")
    else:
        layout, fits = Served.GENERATE, ("auto", "generate", "score")
    if task not in fits:
        what = {Served.CROSS_ENCODER: "a cross-encoder, which serves --task score",
                Served.EMBED: "a sentence-transformers embedding model, which serves --task embed",
                Served.GENERATE: "a decoder, which serves --task generate, or score as a yes/no reranker (use "
                                 "--enable-embeddings for its embeddings)"}[layout]
        raise ValueError(f"--task {task}: {model_dir} is {what}")
    return Served.YES_NO if layout is Served.GENERATE and task == "score" else layout
