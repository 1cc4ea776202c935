"""SGLang's `/generate` answer: `{"text", "output_ids", "meta_info"}` per prompt (a list for a batch), or streamed as
SSE events each holding the text and ids so far (SGLang's cumulative stream), the last with its `finish_reason`,
then `data: [DONE]`. `meta_info` has SGLang's counts and why it stopped: `{"type": "length", "length": N}`, or
`{"type": "stop", "matched": the stop string or token id}`."""
from __future__ import annotations

import time

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Generation, GenerationFailed
from rill.asgi.http.sse import frame

_encode = msgspec.json.encode


class SGLangAnswer:
    ends_with_done = True
    opens_with_first_token = True

    def __init__(self, request_id: str, num_choices: int, max_new_tokens: int, batch: bool):
        self.request_id = request_id
        self.batch = batch
        self.max_new_tokens = max_new_tokens
        self.started = time.perf_counter()
        self.text = [""] * num_choices
        self.ids: list[list[int]] = [[] for _ in range(num_choices)]
        self.finish: list[str | None] = [None] * num_choices

    def _take(self, deltas: list[ChoiceDelta]) -> list[int]:
        changed = []
        for d in deltas:
            self.text[d.index] += d.text
            self.ids[d.index] += d.token_ids or []
            self.finish[d.index] = d.finish_reason or self.finish[d.index]
            changed.append(d.index)
        return changed

    def _object(self, gen: Generation, i: int) -> dict:
        choice = gen.mailbox.choices[i]
        reason = None
        if self.finish[i] == "length":
            reason = {"type": "length", "length": self.max_new_tokens}
        elif self.finish[i] is not None:
            matched = gen.detokenizers[i].stop_matched
            reason = {"type": "stop", "matched": matched if matched is not None else (self.ids[i] or [None])[-1]}
        meta = {"id": f"{self.request_id}-{i}" if self.batch else self.request_id, "finish_reason": reason,
                "prompt_tokens": len(gen.prompts[i]), "completion_tokens": choice.num_output_tokens,
                "cached_tokens": choice.num_cached_tokens, "e2e_latency": time.perf_counter() - self.started}
        return {"text": self.text[i], "output_ids": self.ids[i], "meta_info": meta, "index": i}

    def opening(self, gen: Generation) -> list[bytes]:
        return []

    def frames(self, deltas: list[ChoiceDelta], gen: Generation) -> list[bytes]:
        return [frame(_encode(self._object(gen, i))) for i in self._take(deltas)]

    def failure(self, exc: GenerationFailed, gen: Generation) -> list[bytes]:
        return [frame(_encode({"error": {"message": str(exc), "code": exc.status}}))]

    def closing(self, gen: Generation) -> list[bytes] | None:
        return None if gen.disconnected else []

    def add(self, deltas: list[ChoiceDelta]) -> None:
        self._take(deltas)

    def body(self, gen: Generation) -> bytes | None:
        if gen.disconnected:
            return None
        objects = [self._object(gen, i) for i in range(len(self.text))]
        return _encode(objects if self.batch else objects[0])
