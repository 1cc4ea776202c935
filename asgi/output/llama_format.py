"""llama.cpp's `/completion` and `/infill` answer: streamed as `data: {"content": ..., "stop": false}` events and a
last one with `"stop": true` and the figures, no `[DONE]`; or that last object as one body. With `return_tokens`
each event (and the body) has the token ids of its text in `tokens`; with `n_probs`, each token's logprob and the
top n in `completion_probabilities` (llama.cpp's pre-sampling form: `id`, `token`, `bytes`, `logprob`,
`top_logprobs`)."""
from __future__ import annotations

import time

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed
from rill.asgi.http.sse import KEEPALIVE as KEEPALIVE_COMMENT
from rill.asgi.http.sse import frame
from rill.asgi.output.logprobs_format import ChatLogprobs
from rill.ipc.logprobs import TokenLogprobs

_encode = msgspec.json.encode


class LlamaAnswer:
    ends_with_done = False
    opens_with_first_token = True
    keepalive = KEEPALIVE_COMMENT

    def __init__(self, model: str, with_tokens: bool = False, probs: ChatLogprobs | None = None):
        self.model = model
        self.with_tokens = with_tokens  # the Generation then gives each delta's token_ids
        self.probs = probs  # n_probs: chat's logprobs entries, with llama.cpp's ids added
        self.all_probs: list[dict] = []
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.text: list[str] = []
        self.tokens: list[int] = []
        self.finish_reason: str | None = None

    def _take(self, deltas: list[ChoiceDelta]) -> list[dict]:
        """Each delta's event fields past `index` (none for a delta that brings nothing to show)."""
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        pieces = []
        for delta in deltas:
            self.finish_reason = delta.finish_reason or self.finish_reason
            ids = delta.token_ids or []
            probs = self._probs(delta.logprobs) if self.probs is not None else []
            if delta.text or (self.with_tokens and ids) or probs:
                piece = {"content": delta.text}
                if self.with_tokens:
                    piece["tokens"] = ids
                if self.probs is not None:
                    piece["completion_probabilities"] = probs
                pieces.append(piece)
                self.text.append(delta.text)
                self.tokens += ids
                self.all_probs += probs
        return pieces

    def _probs(self, lp: TokenLogprobs | None) -> list[dict]:
        rows = self.probs.content(lp)
        if lp is not None:
            for row, row_ids in zip(rows, lp.token_ids.tolist()):
                row["id"] = row_ids[0]
                for top, top_id in zip(row["top_logprobs"], row_ids[1:]):
                    top["id"] = top_id
        return rows

    def opening(self, gen: Generation) -> list[bytes]:
        return []

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        return [frame(_encode({"index": 0, **piece, "stop": False, "id_slot": 0})) for piece in self._take(deltas)]

    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]:
        return [frame(_encode({"error": {"code": exc.status, "message": str(exc), "type": "server_error"}}))]

    def closing(self, gen: Generation) -> list[bytes] | None:
        return None if gen.disconnected else [frame(self._last(gen, "", [], []))]

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._take(deltas)

    def body(self, gen: Generation) -> bytes | None:
        return None if gen.disconnected else self._last(gen, "".join(self.text), self.tokens, self.all_probs)

    def _last(self, gen: Generation, content: str, tokens: list[int], probs: list[dict]) -> bytes:
        """The closing object: the content (all of it, in a body), why it stopped and the figures."""
        usage, now = gen.usage(), time.perf_counter()
        stopping_word = gen.detokenizers[0].stop_matched or ""
        stop_type = "limit" if self.finish_reason == "length" else "word" if stopping_word else "eos"
        first = self.first_token_at or now
        prompt_ms, predicted_ms = (first - self.started) * 1000, (now - first) * 1000
        predicted = usage.completion_tokens
        return _encode({
            "index": 0, "content": content, **({"tokens": tokens} if self.with_tokens else {}),
            **({"completion_probabilities": probs} if self.probs is not None else {}),
            "id_slot": 0, "stop": True, "model": self.model,
            "tokens_predicted": predicted, "tokens_evaluated": usage.prompt_tokens,
            "tokens_cached": usage.cached_tokens, "truncated": False, "has_new_line": "\n" in "".join(self.text),
            "stop_type": stop_type, "stopping_word": stopping_word,
            "timings": {"prompt_n": usage.prompt_tokens - usage.cached_tokens, "prompt_ms": prompt_ms,
                        "predicted_n": predicted, "predicted_ms": predicted_ms,
                        "predicted_per_second": predicted / (predicted_ms / 1000) if predicted_ms > 0 else 0.0},
        })
