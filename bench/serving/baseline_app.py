"""The HTTP ceiling: a bare ASGI app that streams Rill's SSE shape with no engine and no tokenizer.

    python -m rill.bench.serving.baseline_app --port 8100 [--workers 1]
    granian --interface asgi --loop uvloop bench.serving.baseline_app:app

`POST /v1/completions` and `/v1/chat/completions` answer `max_tokens` chunks of a fixed token
text (default 16 when absent), built by Rill's own formatters and SSE writer: the same headers,
the opening role chunk (chat), one chunk per token with `finish_reason` "length" on the last,
the usage chunk when `stream_options.include_usage`, then `data: [DONE]`; or one JSON body
without `stream`. Under Granian with Rill's settings, what it sustains is the most Rill's HTTP
layer could serve on that machine; a benchmark of Rill on a tiny model measures against it.
The body is decoded loosely (no validation) and prompt_tokens is a length estimate.
"""
from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

import msgspec

from rill.asgi.engine_link.generate import ChoiceDelta, Usage
from rill.asgi.errors import APIError
from rill.asgi.http.primitives import ClientDisconnected, read_body, send_response
from rill.asgi.http.sse import SSEWriter
from rill.asgi.output.chat_format import ChatFormatter
from rill.asgi.output.completion_format import CompletionFormatter
from rill.asgi.routes.completions import DEFAULT_MAX_TOKENS

MODEL_ID = "baseline"
TOKEN_TEXT = " token"  # one token per chunk to the bundled tokenizer, if a harness counts them
MAX_BODY_BYTES = 32 << 20
_encode = msgspec.json.encode


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class LooseRequest(msgspec.Struct):
    """The fields the baseline reads, from either route; anything else is ignored."""

    model: str = MODEL_ID
    prompt: Any = None
    messages: list[dict[str, Any]] | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None


_decode_request = msgspec.json.Decoder(LooseRequest).decode


def approx_prompt_tokens(req: LooseRequest) -> int:
    """About 4 characters a token: usage needs a number and the baseline has no tokenizer."""
    if req.messages is not None:
        num_chars = sum(len(m.get("content") or "") for m in req.messages if isinstance(m.get("content"), str))
    elif isinstance(req.prompt, list):
        return len(req.prompt)
    else:
        num_chars = len(req.prompt or "")
    return max(1, num_chars // 4)


async def generate(req: LooseRequest, chat: bool, send) -> None:
    max_tokens = req.max_completion_tokens or req.max_tokens or DEFAULT_MAX_TOKENS
    include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    if chat:
        fmt = ChatFormatter(f"chatcmpl-{uuid.uuid4().hex}", req.model, 1, include_usage)
    else:
        fmt = CompletionFormatter(f"cmpl-{uuid.uuid4().hex}", req.model, 1, include_usage)
    usage = Usage(prompt_tokens=approx_prompt_tokens(req), completion_tokens=max_tokens)
    if not req.stream:
        fmt.add([ChoiceDelta(0, TOKEN_TEXT * max_tokens, "length")])
        await send_response(send, 200, fmt.body(usage))
        return
    sse = SSEWriter(send, keepalive_s=15.0)
    await sse.start()
    for chunk in fmt.opening_chunks():
        await sse.data(chunk)
    for i in range(max_tokens):
        finish = "length" if i == max_tokens - 1 else None
        for chunk in fmt.chunks([ChoiceDelta(0, TOKEN_TEXT, finish)]):
            await sse.data(chunk)
    if include_usage:
        await sse.data(fmt.usage_chunk(usage))
    await sse.done()


def _error(message: str, kind: str = "invalid_request_error") -> bytes:
    return _encode({"error": {"message": message, "type": kind, "param": None, "code": None}})


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    route = (scope["method"], scope["path"].rstrip("/") or "/")
    if route in (("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
        try:
            req = _decode_request(await read_body(receive, MAX_BODY_BYTES))
        except ClientDisconnected:
            return
        except APIError as exc:  # 413
            return await send_response(send, exc.status, exc.body())
        except msgspec.ValidationError as exc:
            return await send_response(send, 400, _error(str(exc)))
        except msgspec.DecodeError:
            return await send_response(send, 400, _error("The body is not valid JSON."))
        await generate(req, route[1].endswith("chat/completions"), send)
    elif route == ("GET", "/v1/models"):
        card = {"id": MODEL_ID, "object": "model", "created": int(time.time()), "owned_by": "rill"}
        await send_response(send, 200, _encode({"object": "list", "data": [card]}))
    elif route in (("GET", "/ready"), ("GET", "/health")):
        await send_response(send, 200, b'{"status":"ready"}')
    else:
        await send_response(send, 404, _error(f"Unknown path: {route[1]}"))


def serve_baseline(port: int, workers: int = 1, host: str = "127.0.0.1", log_level: str = "warning") -> None:
    """Serve until SIGTERM/SIGINT with the Granian settings `rill serve` uses."""
    from granian import Granian
    from granian.constants import Interfaces, Loops

    Granian("rill.bench.serving.baseline_app:app", address=host, port=port, interface=Interfaces.ASGI, workers=workers,
            loop=Loops.uvloop, log_level=log_level, backlog=2048).serve()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.serving.baseline_app", description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = ap.parse_args(argv)
    serve_baseline(args.port, args.workers, args.host, args.log_level)


if __name__ == "__main__":
    main()
