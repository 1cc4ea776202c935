"""The Responses API's input_image parts and Anthropic's image blocks become chat's image_url parts among the text
for a vision model, in their order, and are 400s naming the part for a text-only one (docs/vision.md)."""
from __future__ import annotations

import pytest

from rill.asgi.errors import APIError
from rill.asgi.requests.messages_content import chat_messages
from rill.asgi.requests.responses_input import items_to_messages, typed_items

URL = "data:image/png;base64,iVBORw0KGgo="


def test_responses_input_images_in_order():
    items = typed_items([{"role": "user", "content": [{"type": "input_text", "text": "a"},
                                                      {"type": "input_image", "image_url": URL, "detail": "low"},
                                                      {"type": "input_text", "text": "b"}]}], "input")
    [message] = items_to_messages(items, images=True)
    assert message["content"] == [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": URL}},
                                  {"type": "text", "text": "b"}]
    assert items_to_messages(typed_items([{"role": "user", "content": "plain"}], "input"), images=True) == [
        {"role": "user", "content": "plain"}]


@pytest.mark.parametrize("images,part,param", [
    (False, {"type": "input_image", "image_url": URL}, "input[0].content[1].type"),
    (True, {"type": "input_image", "file_id": "file-1"}, "input[0].content[1].image_url"),
])
def test_responses_bad_images(images, part, param):
    items = typed_items([{"role": "user", "content": [{"type": "input_text", "text": "a"}, part]}], "input")
    with pytest.raises(APIError) as err:
        items_to_messages(items, images=images)
    assert err.value.param == param


def test_anthropic_image_blocks_in_order():
    source = {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"}
    [message] = chat_messages(None, [{"role": "user", "content": [{"type": "image", "source": source},
                                                                  {"type": "text", "text": "what?"}]}], images=True)
    assert message == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,"
                                                                                              "/9j/4AAQ"}},
                                                    {"type": "text", "text": "what?"}]}


@pytest.mark.parametrize("images,source,param", [
    (False, {"type": "base64", "media_type": "image/png", "data": "x"}, "messages[0].content[0].type"),
    (True, {"type": "url", "url": "https://example.com/a.png"}, "messages[0].content[0].source.type"),
    (True, {"type": "base64", "media_type": "text/html", "data": "x"}, "messages[0].content[0].source.media_type"),
    (True, {"type": "base64", "media_type": "image/png", "data": 7}, "messages[0].content[0].source.data"),
])
def test_anthropic_bad_images(images, source, param):
    with pytest.raises(APIError) as err:
        chat_messages(None, [{"role": "user", "content": [{"type": "image", "source": source}]}], images=images)
    assert err.value.param == param
