"""vLLM's bad_words: tokenized as vLLM does (asgi/requests/bad_words.py) and banned by the sampler
(engine_proc/sample/bad_words.py): a one-token word always, a longer one's last token after the rest of it."""
from __future__ import annotations

import torch

from rill.engine_proc.sample.bad_words import BadWords
from rill.engine_proc.sample.sampler import Sampler
from tests.helpers.sampling import EOS_ID, make_seq


def test_a_word_bans_its_last_token_only_after_the_rest_of_it():
    words = BadWords([[7], [3, 4, 5], [9, 4, 6], [4, 8]])
    assert words.banned_now([]) == [7]
    assert words.banned_now([1, 3]) == [7]
    assert words.banned_now([1, 3, 4]) == [7, 5, 8]
    assert words.banned_now([9, 4]) == [7, 6, 8]


def test_the_sampler_never_writes_a_bad_word():
    logits = torch.zeros(1, 50)
    logits[0, 5] = 10.0  # the greedy pick
    logits[0, 6] = 5.0
    seq = make_seq(temperature=0.0, bad_words_ids=[[3, 4, 5]])
    assert Sampler([EOS_ID]).sample(logits, [seq]) == [5]
    seq.req.output_ids = [3, 4]
    assert Sampler([EOS_ID]).sample(logits, [seq]) == [6]
    seq = make_seq(num_generated=2, temperature=0.0, bad_words_ids=[[5], [99]])  # one past the vocabulary
    assert Sampler([EOS_ID]).sample(logits, [seq]) == [6]

