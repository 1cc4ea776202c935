"""Text Generation Inference's answer: `{"generated_text", "details"}` (a list of one for `POST /`), or streamed as
one SSE event a token, `{"index", "token": {"id", "text", "logprob", "special"}, "generated_text", "details"}`, the
last with the whole text and `details` (`finish_reason`: `length`, `eos_token` or `stop_sequence`), no `[DONE]`."""
from __future__ import annotations

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed
from rill.asgi.http.sse import frame
from rill.asgi.output.logprobs_format import MIN_LOGPROB
from rill.asgi.output.token_text import TokenTexts

_encode = msgspec.json.encode


class TGIAnswer:
    ends_with_done = False
    opens_with_first_token = True

    def __init__(self, texts: TokenTexts, special_ids: frozenset[int], *, prefix: str, details: bool, seed: int | None,
                 as_list: bool):
        self.texts = texts
        self.special_ids = special_ids  # the model's stop tokens
        self.prefix = prefix  # return_full_text: the inputs
        self.details = details
        self.seed = seed
        self.as_list = as_list  # POST /: a list of one answer
        self.text: list[str] = []
        self.tokens: list[dict] = []
        self.finish_reason: str | None = None

    def _take(self, deltas: list[ChoiceDelta]) -> list[tuple[int, dict, bool]]:
        """Each token's index, its event's `token`, and whether it ends the answer."""
        out = []
        for d in deltas:
            self.text.append(d.text)
            ids = d.token_ids or []
            logprobs = d.logprobs.logprobs[:, 0].tolist() if d.logprobs is not None else [None] * len(ids)
            for token_id, logprob in zip(ids, logprobs):
                token = {"id": token_id, "text": self.texts.text(token_id),
                         "logprob": max(logprob, MIN_LOGPROB) if logprob is not None else None,
                         "special": token_id in self.special_ids}
                out.append((len(self.tokens), token, False))
                self.tokens.append(token)
            if d.finish_reason is not None:
                self.finish_reason = d.finish_reason
                if out:
                    out[-1] = (*out[-1][:2], True)
                elif self.tokens:  # a last delta without a token of its own: the end goes out with the last one
                    out.append((len(self.tokens) - 1, self.tokens[-1], True))
        return out

    def _details(self, gen: Generation, with_tokens: bool) -> dict:
        matched = gen.detokenizers[0].stop_matched
        reason = "length" if self.finish_reason == "length" else "stop_sequence" if matched else "eos_token"
        details = {"finish_reason": reason, "generated_tokens": gen.usage().completion_tokens, "seed": self.seed}
        return {**details, "prefill": [], "tokens": self.tokens} if with_tokens else details

    def opening(self, gen: Generation) -> list[bytes]:
        return []

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        events = []
        for index, token, last in self._take(deltas):
            event = {"index": index, "token": token, "generated_text": None, "details": None}
            if last:
                event["generated_text"] = self.prefix + "".join(self.text)
                event["details"] = self._details(gen, with_tokens=False)
            events.append(frame(_encode(event)))
        return events

    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]:
        return [frame(_encode({"error": str(exc), "error_type": "generation"}))]

    def closing(self, gen: Generation) -> list[bytes] | None:
        return None if gen.disconnected else []

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._take(deltas)

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        answer = {"generated_text": self.prefix + "".join(self.text)}
        if self.details:
            answer["details"] = self._details(gen, with_tokens=True)
        return _encode([answer] if self.as_list else answer)
