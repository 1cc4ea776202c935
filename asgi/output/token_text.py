"""One token's text and bytes as logprobs show them, cached per worker for the whole vocabulary."""
from __future__ import annotations

import re

from tokenizers import Tokenizer, decoders

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte pieces


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte -> printable character map, inverted (what byte-level BPE pieces spell)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    shift = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenTexts:
    """`text(id)`: the token decoded alone, special tokens shown (what vLLM shows, so a piece of a
    UTF-8 character is "�"); `bytes(id)`: the token's own bytes where the tokenizer knows them
    (byte-level BPE, SentencePiece byte fallback), which join into the text's UTF-8 as OpenAI's do;
    else the text's UTF-8."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._byte_level = _byte_level_decoder() if isinstance(tokenizer.decoder, decoders.ByteLevel) else None
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def text(self, token_id: int) -> str:
        return self._entry(token_id)[0]

    def bytes(self, token_id: int) -> list[int]:
        return self._entry(token_id)[1]

    def _entry(self, token_id: int) -> tuple[str, list[int]]:
        entry = self._cache.get(token_id)
        if entry is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            entry = self._cache[token_id] = (text, self._own_bytes(token_id) or list(text.encode()))
        return entry

    def _own_bytes(self, token_id: int) -> list[int] | None:
        piece = self._tokenizer.id_to_token(token_id)
        if piece is None:
            return None
        if self._byte_level is not None:
            if all(c in self._byte_level for c in piece):
                return [self._byte_level[c] for c in piece]
            return None
        if m := _BYTE_FALLBACK.fullmatch(piece):
            return [int(m.group(1), 16)]
        return None


class TokenIdTexts:
    """vLLM's `return_tokens_as_token_ids`: logprobs name each token "token_id:N" (its bytes that string's), so that a
    client can tell apart tokens whose texts are alike or not valid UTF-8 alone."""

    @staticmethod
    def text(token_id: int) -> str:
        return f"token_id:{token_id}"

    @staticmethod
    def bytes(token_id: int) -> list[int]:
        return list(f"token_id:{token_id}".encode())


def logprob_texts(token_texts: TokenTexts, as_token_ids: bool | None) -> TokenTexts | TokenIdTexts:
    """What a request's logprobs name tokens by: their texts, or "token_id:N" (return_tokens_as_token_ids)."""
    return TokenIdTexts() if as_token_ids else token_texts
