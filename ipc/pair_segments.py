"""How a scored pair (query, document) travels to the engine as one prompt of token ids.

The API worker encodes the pair with the tokenizer's own pair template (`[CLS] q [SEP] d [SEP]`
for BERT). A model with token types (BERT's `token_type_ids`) needs to know where the second
segment starts; rather than carry that beside every prompt, both sides agree on the rule here:
the second segment starts after the first separator token. The worker refuses a pair the rule
would misread (a query that holds the separator's text, which the tokenizer makes the separator).
"""
from __future__ import annotations

from tokenizers import Tokenizer


def pair_separator(tokenizer: Tokenizer) -> int | None:
    """The id that ends a pair's first segment under the tokenizer's post-processor (BERT's [SEP]);
    None when its pairs have one token type only (RoBERTa's, whose models take no token types)."""
    encoding = tokenizer.encode("a", "b")
    if 1 not in encoding.type_ids:
        return None
    return encoding.ids[encoding.type_ids.index(1) - 1]


def second_segment_start(ids: list[int], separator: int) -> int:
    """The index of the second segment's first token in a pair's ids: the one after the first separator."""
    return ids.index(separator) + 1


def follows_the_rule(ids: list[int], type_ids: list[int], separator: int | None) -> bool:
    """Whether `second_segment_start` finds the segments the tokenizer made (`type_ids`)."""
    if separator is None:
        return True
    if 1 not in type_ids or separator not in ids:
        return False
    return second_segment_start(ids, separator) == type_ids.index(1)
