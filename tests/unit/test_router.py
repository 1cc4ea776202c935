"""asgi/http/router.py: literal paths, `{name:shape}` parameters, the 405's methods and the 404."""
from __future__ import annotations

import asyncio

import pytest

from rill.asgi.http.router import MAX_PATH_PARAM_LEN, HTTPRequest, Router


async def a(http):
    pass


async def b(http):
    pass


async def c(http):
    pass


ROUTER = Router([
    ("POST", "/v1/responses", a),
    ("POST", "/v1/responses/input_tokens", b),
    ("GET", "/v1/responses/{response_id:resp}", c),
    ("DELETE", "/v1/responses/{response_id:resp}", a),
    ("GET", "/v1/responses/{response_id:resp}/input_items", b),
    ("GET", "/v1/c/{cid:conv}/items/{item_id:item}", c),
    ("GET", "/v1/plain/{name}", c),
    ("GET", "/v1/models/{model_id:path}", a),
], shapes={"resp": r"resp_[A-Za-z0-9]{1,64}", "conv": r"conv_[A-Za-z0-9]{1,64}", "item": r"[a-z]+_[A-Za-z0-9]+"})


def test_literal_paths_win_over_patterns():
    assert ROUTER.match("POST", "/v1/responses/input_tokens") == (b, {}, [])
    # Not a response id's shape: the pattern binds nothing, and the literal path's method is the 405's.
    assert ROUTER.match("GET", "/v1/responses/input_tokens") == (None, {}, ["POST"])


def test_parameters_bind_by_segment():
    assert ROUTER.match("GET", "/v1/responses/resp_1") == (c, {"response_id": "resp_1"}, [])
    assert ROUTER.match("GET", "/v1/responses/resp_1/input_items") == (b, {"response_id": "resp_1"}, [])
    assert ROUTER.match("GET", "/v1/c/conv_x/items/msg_y") == (c, {"cid": "conv_x", "item_id": "msg_y"}, [])
    assert ROUTER.match("GET", "/v1/c/conv_x/other/msg_y")[0] is None
    assert ROUTER.match("GET", "/v1/c//items/y") == (None, {}, [])  # an empty segment binds nothing


@pytest.mark.parametrize("path", [
    "/v1/responses/index", "/v1/responses/resp_", "/v1/responses/resp_a-b", "/v1/responses/resp_" + "a" * 65,
    "/v1/responses/conv_1", "/v1/responses/resp_1:x", "/v1/responses/resp_\u00e9", "/v1/responses/resp_1\n",
    "/v1/c/index/items/msg_y", "/v1/c/conv_1/items/a:b", "/v1/c/conv_1/items/_x", "/v1/c/conv_1/items/msg_",
    "/v1/plain/a.b", "/v1/plain/-a",
])
def test_a_parameter_of_the_wrong_shape_binds_nothing(path):
    assert ROUTER.match("GET", path) == (None, {}, [])
    assert ROUTER.match("DELETE", path)[0] is None


def test_parameters_of_the_right_shape_bind():
    assert ROUTER.match("GET", "/v1/responses/resp_" + "a" * 64)[0] is c
    assert ROUTER.match("GET", "/v1/c/conv_AB09/items/fc_1xY")[1] == {"cid": "conv_AB09", "item_id": "fc_1xY"}
    assert ROUTER.match("GET", "/v1/plain/Ab-0_9")[1] == {"name": "Ab-0_9"}  # a bare `{name}` is an `id`
    assert ROUTER.match("GET", "/v1/plain/" + "a" * 129)[0] is None


def test_a_pattern_names_a_known_shape():
    with pytest.raises(ValueError, match="unknown parameter shape"):
        Router([("GET", "/x/{id:uuid}", a)])
    assert Router([("GET", "/x/{id:uuid}", a)], shapes={"uuid": "[0-9a-f]{32}"}).match("GET", "/x/" + "0" * 32)[0] is a
    with pytest.raises(ValueError, match="only the last"):
        Router([("GET", "/x/{rest:path}/y", a)])


def test_a_path_parameter_takes_the_rest():
    assert ROUTER.match("GET", "/v1/models/org/name") == (a, {"model_id": "org/name"}, [])
    assert ROUTER.match("GET", "/v1/models/m") == (a, {"model_id": "m"}, [])
    assert ROUTER.match("GET", "/v1/models/" + "m" * MAX_PATH_PARAM_LEN)[0] is a


def test_a_path_parameter_is_bounded_and_printable():
    for rest in ("m" * (MAX_PATH_PARAM_LEN + 1), "a\nb", "a\x00b", "a\x7fb", "a\u2028b"):
        assert ROUTER.match("GET", "/v1/models/" + rest) == (None, {}, [])


def test_a_known_path_with_another_method_lists_its_methods():
    assert ROUTER.match("PUT", "/v1/responses/resp_r") == (None, {}, ["GET", "DELETE"])
    assert ROUTER.match("GET", "/v1/responses") == (None, {}, ["POST"])
    assert ROUTER.match("POST", "/v1/models/org/name") == (None, {}, ["GET"])


def test_an_unknown_path_has_no_methods():
    assert ROUTER.match("GET", "/v1/nothing") == (None, {}, [])
    assert ROUTER.match("GET", "/v1/responses/resp_r/input_items/extra") == (None, {}, [])


def test_every_handler_takes_one_http_request():
    seen = []

    async def handler(http: HTTPRequest) -> None:
        seen.append((http.body, http.params))

    router = Router([("POST", "/x/{id}", handler)])
    found, params, _ = router.match("POST", "/x/7")
    asyncio.run(found(HTTPRequest(state=None, receive=None, send=None, body=b"{}", params=params)))
    assert seen == [(b"{}", {"id": "7"})]
