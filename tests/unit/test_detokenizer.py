"""Detokenizer: joined output equals tokenizer.decode cut at the first stop, for any split."""

from __future__ import annotations

import random

import pytest
import tokenizers

import rill.asgi.output.detokenizer as detokenizer_module
from rill.asgi.output.detokenizer import Detokenizer

MULTILINGUAL_TEXT = (
    "Hello 世界! 🎉👨\u200d👩\u200d👧 naïve café. 日本語のテキスト、絵文字😀😃😄も。"
    " The quick brown fox jumps over the lazy dog. STOP here, then END."
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: which character stands for each byte in the vocab."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def _byte_token_id(tokenizer: tokenizers.Tokenizer, byte: int) -> int:
    token_id = tokenizer.token_to_id(_bytes_to_unicode()[byte])
    assert token_id is not None
    return token_id


def _run(tokenizer, ids, chunk_lens, **kwargs) -> tuple[list[str], Detokenizer]:
    """Push ids in chunks of the given lengths (the rest at once), then flush."""
    detok = Detokenizer(tokenizer, **kwargs)
    pieces, start = [], 0
    for chunk_len in chunk_lens:
        pieces.append(detok.push(ids[start:start + chunk_len]))
        start += chunk_len
    pieces.append(detok.push(ids[start:]))
    pieces.append(detok.flush())
    return pieces, detok


def _expected(tokenizer, ids, stop=(), include=False, skip=True) -> tuple[str, str | None]:
    """decode(ids) cut at the stop string that ends first (ties: the longer one)."""
    text = tokenizer.decode(ids, skip_special_tokens=skip)
    best = None
    for s in stop:
        start = text.find(s) if s else -1
        if start >= 0:
            key = (start + len(s), -len(s), s)
            best = key if best is None or key < best else best
    if best is None:
        return text, None
    end, _, s = best
    return (text[:end] if include else text[:end - len(s)]), s


def test_one_token_at_a_time_never_emits_a_broken_character(tokenizer):
    ids = tokenizer.encode(MULTILINGUAL_TEXT).ids
    pieces, _ = _run(tokenizer, ids, [1] * len(ids))
    assert "".join(pieces) == MULTILINGUAL_TEXT
    assert all("\ufffd" not in piece for piece in pieces)
    # The emoji and CJK characters span several tokens: some pushes must have waited.
    assert pieces.count("") > 0


@pytest.mark.parametrize("chunk_len", [1, 2, 3, 7, 1000])
def test_chunked_pushes_give_the_same_text(tokenizer, chunk_len):
    ids = tokenizer.encode(MULTILINGUAL_TEXT).ids
    pieces, detok = _run(tokenizer, ids, [chunk_len] * (len(ids) // chunk_len))
    assert "".join(pieces) == MULTILINGUAL_TEXT
    assert detok.stop_matched is None


def test_numpy_and_array_ids(tokenizer):
    import array

    import numpy as np

    ids = tokenizer.encode(MULTILINGUAL_TEXT).ids
    makers = (lambda chunk: np.asarray(chunk, dtype=np.int32),
              lambda chunk: array.array("i", chunk))
    for make in makers:
        detok = Detokenizer(tokenizer, stop=["END."])
        text = "".join(detok.push(make(ids[i:i + 3])) for i in range(0, len(ids), 3))
        assert text + detok.flush() == MULTILINGUAL_TEXT[: MULTILINGUAL_TEXT.index("END.")]
        assert detok.push(make([])) == ""


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("Hi<|im_end|> there").ids
    assert 2 in ids  # <|im_end|>
    skipped, _ = _run(tokenizer, ids, [1] * len(ids), skip_special_tokens=True)
    kept, _ = _run(tokenizer, ids, [1] * len(ids), skip_special_tokens=False)
    assert "".join(skipped) == "Hi there"
    assert "".join(kept) == "Hi<|im_end|> there"


def test_stop_string_spanning_tokens_is_cut_and_never_leaks(tokenizer):
    text = "The answer is forty-two. Goodbye now"
    ids = tokenizer.encode(text).ids
    stop = "two. Good"  # spans several tokens
    detok = Detokenizer(tokenizer, stop=[stop])
    sent = ""
    for token_id in ids:
        sent += detok.push([token_id])
        # Sent text is final: it must never hold the start of the stop string at its end.
        assert stop not in sent
    assert sent == "The answer is forty-"
    assert detok.stop_matched == stop
    assert detok.push(tokenizer.encode(" more").ids) == ""
    assert detok.flush() == ""


def test_include_stop_str_in_output(tokenizer):
    ids = tokenizer.encode("one two three four").ids
    pieces, detok = _run(tokenizer, ids, [1] * len(ids), stop=[" three"],
                         include_stop_str_in_output=True)
    assert "".join(pieces) == "one two three"
    assert detok.stop_matched == " three"


def test_holds_back_one_char_less_than_the_longest_stop(tokenizer):
    detok = Detokenizer(tokenizer, stop=["xyz", "q"])
    assert detok.push(tokenizer.encode("abcdef").ids) == "abcd"
    assert detok.flush() == "ef"
    assert detok.stop_matched is None


def test_first_ending_stop_wins_whatever_the_chunking(tokenizer):
    text = "alpha beta gamma delta"
    ids = tokenizer.encode(text).ids
    stops = ["gamma", "beta gamma", " delta"]
    for chunk_lens in ([1] * len(ids), [len(ids)], [2, 1, 3]):
        pieces, detok = _run(tokenizer, ids, chunk_lens, stop=stops)
        # Both end at the same character: the longer (earlier-starting) one wins.
        assert "".join(pieces) == "alpha "
        assert detok.stop_matched == "beta gamma"
    for chunk_lens in ([1] * len(ids), [len(ids)]):
        pieces, detok = _run(tokenizer, ids, chunk_lens, stop=["a gamma d", "mm"])
        assert "".join(pieces) == "alpha beta ga"  # "mm" completes before "a gamma d"
        assert detok.stop_matched == "mm"


def test_empty_stop_strings_are_ignored(tokenizer):
    ids = tokenizer.encode("plain text").ids
    pieces, detok = _run(tokenizer, ids, [1] * len(ids), stop=[""])
    assert "".join(pieces) == "plain text"
    assert detok.stop_matched is None


def test_stop_found_only_in_the_flushed_tail(tokenizer):
    # A lone lead byte decodes to U+FFFD only at the end: a stop on it must still cut there.
    ids = tokenizer.encode("abc").ids + [_byte_token_id(tokenizer, 0xF0)]
    pieces, detok = _run(tokenizer, ids, [1] * len(ids), stop=["\ufffd"])
    assert "".join(pieces) == "abc"
    assert detok.stop_matched == "\ufffd"


def test_invalid_bytes_match_decode_and_stay_bounded(tokenizer):
    continuation = _byte_token_id(tokenizer, 0x80)
    lead = _byte_token_id(tokenizer, 0xF0)
    ids = ([continuation] * 50 + tokenizer.encode(" hello").ids + [lead] * 3
           + tokenizer.encode("x 😀").ids + [lead])
    for chunk_len in (1, 5):
        pieces, _ = _run(tokenizer, ids, [chunk_len] * (len(ids) // chunk_len))
        assert "".join(pieces) == tokenizer.decode(ids)
        # 50 ids that never form a character still come out before the end of the request.
        assert any(pieces[:-2])


class _FlakyDecodeStream:
    """Wraps DecodeStream and fails some steps, as DecodeStream does on InvalidPrefix."""

    failing_steps = {3, 4, 10, 17, 30}  # counted across instances; 3 and 4 fail the replay too
    num_steps = 0

    def __init__(self, **kwargs):
        self._inner = _REAL_DECODE_STREAM(**kwargs)

    def step(self, tokenizer, ids):
        type(self).num_steps += 1
        if self.num_steps in self.failing_steps:
            raise Exception("DecodeStream error: InvalidPrefix")
        return self._inner.step(tokenizer, ids)


_REAL_DECODE_STREAM = detokenizer_module.DecodeStream


def test_decode_stream_errors_fall_back_to_plain_decode(tokenizer, monkeypatch):
    monkeypatch.setattr(detokenizer_module, "DecodeStream", _FlakyDecodeStream)
    ids = tokenizer.encode(MULTILINGUAL_TEXT).ids
    for chunk_len in (1, 2):
        _FlakyDecodeStream.num_steps = 0
        pieces, _ = _run(tokenizer, ids, [chunk_len] * (len(ids) // chunk_len))
        assert "".join(pieces) == MULTILINGUAL_TEXT


def test_random_ids_stops_and_splits_keep_the_invariant(tokenizer):
    rng = random.Random(1234)
    vocab_size = tokenizer.get_vocab_size()
    texts = [MULTILINGUAL_TEXT, "a" * 30 + "ab" + "b" * 10, "<|im_end|>x<|im_start|>y"]
    for _ in range(300):
        kind = rng.random()
        if kind < 0.4:
            ids = tokenizer.encode(rng.choice(texts)).ids
        elif kind < 0.7:
            ids = [rng.randrange(vocab_size) for _ in range(rng.randrange(40))]
        else:  # low ids: special tokens and single bytes, many invalid sequences
            ids = [rng.randrange(400) for _ in range(rng.randrange(60))]
        text = tokenizer.decode(ids)
        stops = []
        for _ in range(rng.randrange(3)):
            if text and rng.random() < 0.7:
                start = rng.randrange(len(text))
                stops.append(text[start:start + rng.randrange(1, 6)])
            else:
                stops.append(rng.choice(["STOP", "ab", "b", "世界", "\ufffd", "<|im_end|>", ""]))
        include = rng.random() < 0.3
        skip = rng.random() < 0.7
        chunk_lens, left = [], len(ids)
        while left > 0:
            chunk_lens.append(rng.choice([1, 1, 1, 2, 3, 7]))
            left -= chunk_lens[-1]
        pieces, detok = _run(tokenizer, ids, chunk_lens, stop=stops,
                             include_stop_str_in_output=include, skip_special_tokens=skip)
        expected_text, expected_stop = _expected(tokenizer, ids, stops, include, skip)
        assert ("".join(pieces), detok.stop_matched) == (expected_text, expected_stop), (
            ids, chunk_lens, stops, include, skip)
