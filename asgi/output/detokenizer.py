"""Incremental detokenization of one request's output: UTF-8 safe, stop strings held back."""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers
from tokenizers.decoders import DecodeStream

# Ids kept from the last emitted text, to decode pending ids in context on the slow path
# (Metaspace decoders drop the leading space of a sequence's first token).
_NUM_CONTEXT_IDS = 4
# A UTF-8 character spans at most 4 byte tokens. Far more pending ids without any text means
# invalid bytes (DecodeStream waits for ever on a trailing U+FFFD) or a run of skipped special
# tokens; DecodeStream re-decodes its whole window on each step, so we emit and restart to keep
# the cost per token bounded.
_MAX_PENDING_IDS = 32


class Detokenizer:
    """Turns the token ids of one request into text that is safe to send.

    push(ids) returns the new text; flush() returns what was held back once the request ends.
    Everything returned, joined, equals tokenizer.decode(all_ids) cut at the first stop string,
    however the ids were split into pushes.

    "First stop string" means the one that ends first in the text (ties: the longer one).
    That is the match a token-by-token stream sees first, so the answer does not depend on how
    the ids were chunked; it is also the earliest-starting match unless stop strings overlap.
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        # An empty stop string would match at once and cut all output: ignore it.
        self._stops = tuple(dict.fromkeys(s for s in stop if s))
        self.include_stop = include_stop_str_in_output
        # Characters held back so that no prefix of a stop string reaches the client early.
        self._num_held_chars = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        self._pending_ids: list[int] = []  # pushed, not yet turned into text by the stream
        self._context_ids: list[int] = []  # the last few ids whose text was emitted
        self._done = False
        self.stop_matched: str | None = None

    def push(self, ids: Sequence[int]) -> str:
        """Feed new token ids; return the text that may be sent now (possibly "")."""
        if self._done or len(ids) == 0:  # len(): ids may be a numpy array
            return ""
        return self._release(self._decode(ids))

    def flush(self) -> str:
        """End of request: return all text still held back (pending bytes decode lossily)."""
        if self._done:
            return ""
        tail = self._decode_pending() if self._pending_ids else ""
        text = self._release(tail, final=True)
        self._done = True
        return text

    # -- decoding ---------------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        # tolist() turns numpy / array.array ids into Python ints, which DecodeStream needs.
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        try:
            text = self._stream.step(self._tokenizer, ids if len(ids) > 1 else ids[0])
        except Exception:
            # DecodeStream raises if a decoder rewrites earlier text (InvalidPrefix).
            self._pending_ids.extend(ids)
            return self._replay_pending()
        if text is None:
            self._pending_ids.extend(ids)
            if len(self._pending_ids) > _MAX_PENDING_IDS:
                return self._emit_pending()
            return ""
        self._remember_emitted(ids)
        return text

    def _remember_emitted(self, ids: list[int]) -> None:
        emitted = self._pending_ids + ids if self._pending_ids else ids
        self._context_ids = (self._context_ids + emitted)[-_NUM_CONTEXT_IDS:]
        self._pending_ids = []

    def _replay_pending(self) -> str:
        """Feed the pending ids again to a fresh stream; it still waits for split characters."""
        try:
            self._stream = self._new_stream()
            text = self._stream.step(self._tokenizer, list(self._pending_ids))
        except Exception:
            return self._emit_pending()
        if text is None:
            return ""
        self._remember_emitted([])
        return text

    def _emit_pending(self) -> str:
        """Emit the pending ids' text as decode() would, broken bytes and all; start afresh."""
        text = self._decode_pending()
        self._remember_emitted([])
        self._stream = self._new_stream()
        return text

    def _decode_pending(self) -> str:
        """Text of the pending ids, decoded after the context ids (the slow path)."""
        decode = self._tokenizer.decode
        skip = self._skip_special_tokens
        base = decode(self._context_ids, skip_special_tokens=skip)
        full = decode(self._context_ids + self._pending_ids, skip_special_tokens=skip)
        if full.startswith(base):
            return full[len(base):]
        return decode(self._pending_ids, skip_special_tokens=skip)

    def _new_stream(self) -> DecodeStream:
        """A fresh stream primed with the context ids, whose text it must not emit again."""
        skip = self._skip_special_tokens
        stream = DecodeStream(skip_special_tokens=skip)
        if not self._context_ids:
            return stream
        try:
            if stream.step(self._tokenizer, list(self._context_ids)) is not None:
                return stream
        except Exception:
            pass
        # Context ending in broken bytes would be held and emitted twice: go without it.
        return DecodeStream(skip_special_tokens=skip)

    # -- stop strings -----------------------------------------------------------------------

    def _release(self, new_text: str, *, final: bool = False) -> str:
        """Append new text; return what may be sent, holding back a possible stop prefix."""
        if not self._stops:
            return new_text
        window = self._held + new_text
        match = self._find_stop(window, num_old_chars=len(self._held))
        if match is not None:
            stop, start = match
            self.stop_matched = stop
            self._done = True
            self._held = ""
            return window[: start + len(stop)] if self.include_stop else window[:start]
        if final:
            self._held = ""
            return window
        cut = max(len(window) - self._num_held_chars, 0)
        self._held = window[cut:]
        return window[:cut]

    def _find_stop(self, window: str, *, num_old_chars: int) -> tuple[str, int] | None:
        """The match that ends first in window (ties: longest); only matches ending in new text.

        Matches lying wholly in the old (held) part were ruled out by the previous call, so
        each stop is searched from where a match could first reach the new text.
        """
        best: tuple[int, int, str] | None = None  # (end, -len, stop): min wins
        for stop in self._stops:
            start = window.find(stop, max(num_old_chars - len(stop) + 1, 0))
            if start < 0:
                continue
            key = (start + len(stop), -len(stop), stop)
            if best is None or key < best:
                best = key
        if best is None:
            return None
        end, _, stop = best
        return stop, end - len(stop)
