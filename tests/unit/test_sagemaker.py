"""POST /invocations picks the route its body's top-level keys name, as vLLM's SageMaker route does."""
from __future__ import annotations

import pytest

from rill.asgi.errors import APIError
from rill.asgi.routes.sagemaker import invocations_route, top_level_keys


@pytest.mark.parametrize(("body", "generates", "classifies", "path"), [
    (b'{"messages": [], "prompt": "x"}', True, False, "/v1/chat/completions"),  # chat first, as vLLM tries it
    (b'{"prompt": "Hi", "input": "x"}', True, False, "/v1/completions"),
    (b'{"query": "q", "documents": ["d"]}', False, False, "/rerank"),
    (b'{"text_1": "a", "text_2": "b"}', False, False, "/score"),
    (b'{"input": "Hi"}', True, False, "/v1/embeddings"),
    (b'{"input": "Hi"}', False, True, "/classify"),
    (b'{"messages": []}', False, True, "/classify"),  # a classifier's chat form
    (b'{"messages": []}', False, False, "/v1/embeddings"),
])
def test_the_keys_name_the_route(body, generates, classifies, path):
    assert invocations_route(top_level_keys(body), generates, classifies) == path


@pytest.mark.parametrize("body", [b'{}', b'{"query": "q"}', b'{"text_1": "a"}', b'{"model": "m", "documents": []}'])
def test_a_body_that_names_no_route_is_a_400_listing_them(body):
    with pytest.raises(APIError) as err:
        invocations_route(top_level_keys(body), True, False)
    assert err.value.status == 400 and "`messages` (chat completions)" in err.value.message


@pytest.mark.parametrize("body", [b"[1, 2]", b"not json", b'"text"', b'{"a": 1', b"\xff\xfe"])
def test_a_body_that_is_no_json_object_is_a_400(body):
    with pytest.raises(APIError) as err:
        top_level_keys(body)
    assert err.value.status == 400 and err.value.code == "invalid_json"
