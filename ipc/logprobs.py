"""Token logprobs as numpy arrays, and their compact wire form: raw little-endian bytes inline.

bench/ipc/ipc_bench.py found raw bytes inline in the msgpack frame as fast as a shared-memory ring
for a step with top-20 logprobs (README, "Measured"), so each array travels as one `bytes` field and
is read back with `np.frombuffer`, without a copy.
"""
from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

_IDS = np.dtype("<i4")
_LOGPROBS = np.dtype("<f4")


@dataclass(eq=False)
class TokenLogprobs:
    """Logprobs of `num_tokens` consecutive tokens of one request, each with its top `num_top`.

    token_ids [num_tokens, 1 + num_top] int32: column 0 is the chosen token, then the top ids;
    logprobs [num_tokens, 1 + num_top] float32, matching token_ids;
    ranks [num_tokens] int32: the chosen token's 1-based rank among the whole vocabulary.
    """

    token_ids: np.ndarray
    logprobs: np.ndarray
    ranks: np.ndarray

    @property
    def num_tokens(self) -> int:
        return self.token_ids.shape[0]

    @property
    def num_top(self) -> int:
        return self.token_ids.shape[1] - 1

    def head(self, num_tokens: int) -> TokenLogprobs:
        """The first `num_tokens` tokens' logprobs."""
        return TokenLogprobs(self.token_ids[:num_tokens], self.logprobs[:num_tokens], self.ranks[:num_tokens])

    @staticmethod
    def concat(parts: list[TokenLogprobs]) -> TokenLogprobs:
        """Consecutive parts of one request (all with the same num_top) as one."""
        if len(parts) == 1:
            return parts[0]
        return TokenLogprobs(
            np.concatenate([p.token_ids for p in parts]),
            np.concatenate([p.logprobs for p in parts]),
            np.concatenate([p.ranks for p in parts]),
        )


class LogprobsPayload(msgspec.Struct, array_like=True, gc=False):
    """TokenLogprobs on the wire: shapes in `num_top`, arrays as raw bytes (see module doc)."""

    num_top: int
    token_ids: bytes
    logprobs: bytes
    ranks: bytes


def encode_logprobs(lp: TokenLogprobs) -> LogprobsPayload:
    return LogprobsPayload(
        lp.num_top,
        np.ascontiguousarray(lp.token_ids, dtype=_IDS).tobytes(),
        np.ascontiguousarray(lp.logprobs, dtype=_LOGPROBS).tobytes(),
        np.ascontiguousarray(lp.ranks, dtype=_IDS).tobytes(),
    )


def decode_logprobs(payload: LogprobsPayload) -> TokenLogprobs:
    """Read-only views over the payload's bytes (no copy)."""
    width = payload.num_top + 1
    ranks = np.frombuffer(payload.ranks, dtype=_IDS)
    shape = (ranks.shape[0], width)
    return TokenLogprobs(
        np.frombuffer(payload.token_ids, dtype=_IDS).reshape(shape),
        np.frombuffer(payload.logprobs, dtype=_LOGPROBS).reshape(shape),
        ranks,
    )
