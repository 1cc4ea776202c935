"""`include: ["reasoning.encrypted_content"]`: a reasoning item's text carried by the client, as Codex CLI and the
Agents SDK carry it with `store: false`, and read back into the prompt when the item comes back as input.

OpenAI encrypts it to hide the model's thinking; Rill shows that thinking anyway (the item's `reasoning_text`), so
the blob is only an encoding, marked as Rill's: a prefix, then the text's UTF-8 in URL-safe base64. A blob of another
server's (an OpenAI conversation carried over) cannot be read: it is passed over, and that item adds no reasoning.
One of Rill's that does not decode is a 400 naming it.
"""
from __future__ import annotations

import base64
import binascii

from rill.asgi.errors import APIError

PREFIX = "rill-reasoning-v1."


def seal(text: str) -> str:
    return PREFIX + base64.urlsafe_b64encode(text.encode()).decode("ascii")


def unseal(blob: object, param: str) -> str:
    """The text in a blob of Rill's; "" for another server's or none."""
    if not isinstance(blob, str) or not blob.startswith(PREFIX):
        return ""
    try:
        return base64.b64decode(blob[len(PREFIX):].encode("ascii"), altchars=b"-_", validate=True).decode("utf-8")
    except (ValueError, binascii.Error, UnicodeError):
        raise APIError(400, "This `encrypted_content` is not one Rill wrote (it does not decode); send the reasoning "
                            "item as it was given back.", param=param) from None
