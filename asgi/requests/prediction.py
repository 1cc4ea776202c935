"""OpenAI's Predicted Outputs on chat completions: `prediction: {"type": "content", "content": ...}`.

The predicted text (the file being edited, say) is tokenized here and sent with the request; the engine
drafts from it wherever the output follows it (engine_proc/spec/prediction.py) and the model verifies the
drafts, so the output is the model's own, token for token, with or without a prediction. Only the first
max_model_len tokens can ever be drafted: the rest is dropped.
"""
from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from rill.asgi.prompt.encoding import encode_texts
from rill.asgi.requests.bounds import MAX_CONTENT_PARTS


class PredictionPart(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class Prediction(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["content"]
    content: str | Annotated[list[PredictionPart], Meta(max_length=MAX_CONTENT_PARTS)]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


async def prediction_ids(tokenizer, prediction: Prediction | None, max_model_len: int) -> list[int]:
    """The predicted content's token ids, at most max_model_len of them ([] without a prediction)."""
    if prediction is None or not (text := prediction.text()):
        return []
    # Characters first, to bound the tokenizer's work: 32 a token is more than real text averages.
    [ids] = await encode_texts(tokenizer, [text[: max_model_len * 32]], add_special_tokens=False)
    return ids[:max_model_len]
