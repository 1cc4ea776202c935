"""asgi/http/router.py: literal paths, `{name}` parameters, the 405's methods and the 404."""
from __future__ import annotations

import asyncio

from asgi.http.router import HTTPRequest, Router


async def a(http):
    pass


async def b(http):
    pass


async def c(http):
    pass


ROUTER = Router([
    ("POST", "/v1/responses", a),
    ("POST", "/v1/responses/input_tokens", b),
    ("GET", "/v1/responses/{response_id}", c),
    ("DELETE", "/v1/responses/{response_id}", a),
    ("GET", "/v1/responses/{response_id}/input_items", b),
    ("GET", "/v1/c/{cid}/items/{item_id}", c),
    ("GET", "/v1/models/{model_id:path}", a),
])


def test_literal_paths_win_over_patterns():
    assert ROUTER.match("POST", "/v1/responses/input_tokens") == (b, {}, [])
    assert ROUTER.match("GET", "/v1/responses/input_tokens") == (c, {"response_id": "input_tokens"}, [])


def test_parameters_bind_by_segment():
    assert ROUTER.match("GET", "/v1/responses/resp_1") == (c, {"response_id": "resp_1"}, [])
    assert ROUTER.match("GET", "/v1/responses/resp_1/input_items") == (b, {"response_id": "resp_1"}, [])
    assert ROUTER.match("GET", "/v1/c/x/items/y") == (c, {"cid": "x", "item_id": "y"}, [])
    assert ROUTER.match("GET", "/v1/c/x/other/y")[0] is None
    assert ROUTER.match("GET", "/v1/c//items/y") == (None, {}, [])  # an empty segment binds nothing


def test_a_path_parameter_takes_the_rest():
    assert ROUTER.match("GET", "/v1/models/org/name") == (a, {"model_id": "org/name"}, [])
    assert ROUTER.match("GET", "/v1/models/m") == (a, {"model_id": "m"}, [])


def test_a_known_path_with_another_method_lists_its_methods():
    assert ROUTER.match("PUT", "/v1/responses/r") == (None, {}, ["GET", "DELETE"])
    assert ROUTER.match("GET", "/v1/responses") == (None, {}, ["POST"])
    assert ROUTER.match("POST", "/v1/models/org/name") == (None, {}, ["GET"])


def test_an_unknown_path_has_no_methods():
    assert ROUTER.match("GET", "/v1/nothing") == (None, {}, [])
    assert ROUTER.match("GET", "/v1/responses/r/input_items/extra") == (None, {}, [])


def test_every_handler_takes_one_http_request():
    seen = []

    async def handler(http: HTTPRequest) -> None:
        seen.append((http.body, http.params))

    router = Router([("POST", "/x/{id}", handler)])
    found, params, _ = router.match("POST", "/x/7")
    asyncio.run(found(HTTPRequest(state=None, receive=None, send=None, body=b"{}", params=params)))
    assert seen == [(b"{}", {"id": "7"})]
