"""TokenLogprobs in OpenAI's two wire shapes: chat's `content` entries and completions' legacy lists.

A logprob of -inf (a token the model rules out) is clamped to -9999.0, as vLLM does: JSON has no
infinity.
"""
from __future__ import annotations

from rill.asgi.output.token_text import TokenTexts
from rill.ipc.logprobs import TokenLogprobs

MIN_LOGPROB = -9999.0


def _clamp(logprob: float) -> float:
    return logprob if logprob >= MIN_LOGPROB else MIN_LOGPROB  # NaN never comes: log_softmax of finite logits


class ChatLogprobs:
    """chat `logprobs.content`: per token {token, logprob, bytes, top_logprobs: [the top k]}."""

    def __init__(self, texts: TokenTexts, num_top: int):
        self.texts = texts
        self.num_top = num_top

    def content(self, lp: TokenLogprobs | None) -> list[dict]:
        if lp is None:
            return []
        texts, k = self.texts, self.num_top
        ids, logprobs = lp.token_ids.tolist(), lp.logprobs.tolist()
        return [{"token": texts.text(row_ids[0]), "logprob": _clamp(row_lps[0]), "bytes": texts.bytes(row_ids[0]),
                 "top_logprobs": [{"token": texts.text(t), "logprob": _clamp(x), "bytes": texts.bytes(t)}
                                  for t, x in zip(row_ids[1 : 1 + k], row_lps[1 : 1 + k])]}
                for row_ids, row_lps in zip(ids, logprobs)]


class CompletionLogprobs:
    """completions' legacy `logprobs` of one choice: {tokens, token_logprobs, top_logprobs, text_offset}.

    top_logprobs maps token text -> logprob for the top k and the sampled token (up to k + 1
    entries, as OpenAI documents). text_offset counts the characters of the tokens before, from
    the choice's start, so streamed pieces join into the non-streamed lists.
    """

    def __init__(self, texts: TokenTexts, num_top: int):
        self.texts = texts
        self.num_top = num_top
        self.text_offset = 0

    def piece(self, lp: TokenLogprobs | None) -> dict:
        out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        if lp is None:
            return out
        texts, k = self.texts, self.num_top
        for row_ids, row_lps in zip(lp.token_ids.tolist(), lp.logprobs.tolist()):
            token = texts.text(row_ids[0])
            top = {texts.text(t): _clamp(x) for t, x in zip(row_ids[1 : 1 + k], row_lps[1 : 1 + k])}
            top.setdefault(token, _clamp(row_lps[0]))
            out["tokens"].append(token)
            out["token_logprobs"].append(_clamp(row_lps[0]))
            out["top_logprobs"].append(top)
            out["text_offset"].append(self.text_offset)
            self.text_offset += len(token)
        return out

    def prompt_piece(self, first_id: int, lp: TokenLogprobs | None) -> dict:
        """An echoed prompt's tokens (`lp`: tokens 1..n-1): the first has no logprob, null as in
        OpenAI's legacy API and vLLM (which OpenAI's spec and SDK types do not allow for)."""
        token = self.texts.text(first_id)
        out: dict = {"tokens": [token], "token_logprobs": [None], "top_logprobs": [None],
                     "text_offset": [self.text_offset]}
        self.text_offset += len(token)
        merge_completion_logprobs(out, self.piece(lp))
        return out


def merge_completion_logprobs(into: dict, piece: dict) -> None:
    for key, values in piece.items():
        into[key].extend(values)


def prompt_logprobs(texts: TokenTexts, lp: TokenLogprobs | None, num_top: int) -> list[dict | None]:
    """vLLM's `prompt_logprobs`: null for the first prompt token, then per token a map of token id
    (as a string) -> {logprob, rank, decoded_token}: the prompt token itself, then the top `num_top`."""
    out: list[dict | None] = [None]
    if lp is None:
        return out
    for row_ids, row_lps, rank in zip(lp.token_ids.tolist(), lp.logprobs.tolist(), lp.ranks.tolist()):
        entry = {str(row_ids[0]): {"logprob": _clamp(row_lps[0]), "rank": rank, "decoded_token": texts.text(row_ids[0])}}
        for top_rank, (t, x) in enumerate(zip(row_ids[1 : 1 + num_top], row_lps[1 : 1 + num_top]), 1):
            entry.setdefault(str(t), {"logprob": _clamp(x), "rank": top_rank, "decoded_token": texts.text(t)})
        out.append(entry)
    return out
