"""asgi/requests/body.py: the one JSON decoder of request bodies, its failures as OpenAI 400s."""
from __future__ import annotations

import msgspec
import pytest

from rill.asgi.errors import APIError
from rill.asgi.requests.body import decode_json


class Body(msgspec.Struct):
    max_tokens: int = 16


DECODER = msgspec.json.Decoder(Body)


def test_a_good_body_decodes():
    assert decode_json(DECODER, b'{"max_tokens": 4, "extra": [1, {"a": null}]}') == Body(max_tokens=4)


@pytest.mark.parametrize("raw", [
    b'{"max_t\xffokens": 4}',  # msgspec alone would skip the key as unknown
    b'{"max_tokens": 4, "s": "\xc3"}',
    b'{"a": ' * 10_000 + b"1" + b"}" * 10_000,  # RecursionError, outside msgspec's DecodeError
    b'{"max_tokens": 4, "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
    b'{"max_tokens": ',
])
def test_invalid_json_is_a_400_invalid_json(raw):
    with pytest.raises(APIError) as info:
        decode_json(DECODER, raw)
    assert info.value.status == 400 and info.value.code == "invalid_json"


def test_a_wrong_type_names_the_parameter():
    with pytest.raises(APIError) as info:
        decode_json(DECODER, b'{"max_tokens": "four"}')
    assert info.value.status == 400 and info.value.param == "max_tokens"
