"""The bodies of a rerank answer (Jina's, Cohere's and vLLM's `results`), of vLLM's score answer (`data`) and of
vLLM's classify answer (`data`).

Each engine request ends with 2N float32s (N labels) where an embedding's vector goes: the activated
scores, then the raw logits; a pair's are [score, logit] (engine_proc/model/classifier_runner.py).
"""
from __future__ import annotations

import base64
import time

import msgspec
import numpy as np

from rill.asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed


class _Scores:
    """The Shape (asgi/output/respond.py) of a scoring answer: one body, never a stream."""

    ends_with_done = False
    opens_with_first_token = False

    def __init__(self, model: str, activated: bool) -> None:
        self.model = model
        self.activated = activated

    def add(self, deltas: list[ChoiceDelta]) -> None:
        pass  # the scores wait in the mailbox until the body is made

    def scores(self, gen: Generation) -> list[float]:
        scores = []
        for choice in gen.mailbox.choices:
            if choice.embedding is None:
                raise GenerationFailed("The engine returned no score.")
            score, logit = np.frombuffer(choice.embedding, dtype="<f4").tolist()
            scores.append(score if self.activated else logit)
        return scores


class RerankList(_Scores):
    """`results` sorted by relevance, highest first (ties keep the documents' order), the first `top_n`."""

    def __init__(self, model: str, activated: bool, documents: list[str] | None, top_n: int) -> None:
        super().__init__(model, activated)
        self.documents = documents  # None: return_documents false
        self.top_n = top_n  # 0: all

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        scores = self.scores(gen)
        order = sorted(range(len(scores)), key=lambda i: -scores[i])[: self.top_n or None]
        results = []
        for i in order:
            result = {"index": i, "relevance_score": scores[i]}
            if self.documents is not None:
                result["document"] = {"text": self.documents[i]}
            results.append(result)
        tokens = gen.usage().prompt_tokens
        return msgspec.json.encode({"id": gen.request_id, "model": self.model, "results": results,
                                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


class ScoreList(_Scores):
    """vLLM's score answer: one `data` entry per pair, in the pairs' order."""

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(self.scores(gen))]
        tokens = gen.usage().prompt_tokens
        return msgspec.json.encode({"id": gen.request_id, "object": "list", "created": int(time.time()),
                                    "model": self.model, "data": data,
                                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}})


class _PooledList(_Scores):
    """vLLM's list answers of pooled outputs (classify's, pooling's): `data` and the usage, around each input's
    float32s."""

    def outputs(self, gen: Generation) -> list[np.ndarray]:
        if any(choice.embedding is None for choice in gen.mailbox.choices):
            raise GenerationFailed("The engine returned no output.")
        return [np.frombuffer(choice.embedding, dtype="<f4") for choice in gen.mailbox.choices]

    def envelope(self, gen: Generation, data: list[dict]) -> bytes:
        tokens = gen.usage().prompt_tokens
        return msgspec.json.encode({"id": gen.request_id, "object": "list", "created": int(time.time()),
                                    "model": self.model, "data": data,
                                    "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
                                              "prompt_tokens_details": None}})


class ClassifyList(_PooledList):
    """vLLM's classify answer: one `data` entry per input, with the likeliest label and every label's score."""

    def __init__(self, model: str, activated: bool, labels: list[str]) -> None:
        super().__init__(model, activated)
        self.labels = labels

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        data = []
        for i, scores in enumerate(self.outputs(gen)):
            num = len(scores) // 2
            probs = (scores[:num] if self.activated else scores[num:]).tolist()
            best = int(np.argmax(scores[num:]))  # the first of equal logits, as argmax over vLLM's probabilities
            data.append({"index": i, "label": self.labels[best] if best < len(self.labels) else None,
                         "probs": probs, "num_classes": num})
        return self.envelope(gen, data)


class PoolList(_PooledList):
    """vLLM's pooling answer: one `data` entry per input with its pooled output, a classifier's scores (activated or
    raw) or an embedding (`activated` None), as floats or as base64 of their float32 bytes."""

    def __init__(self, model: str, activated: bool | None, base64_format: bool) -> None:
        super().__init__(model, bool(activated))
        self.scores_kind = activated is not None
        self.base64_format = base64_format

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        data = []
        for i, out in enumerate(self.outputs(gen)):
            if self.scores_kind:
                num = len(out) // 2
                out = out[:num] if self.activated else out[num:]
            data.append({"index": i, "object": "pooling",
                         "data": base64.b64encode(out.tobytes()).decode() if self.base64_format else out.tolist()})
        return self.envelope(gen, data)
