"""The HTTP side of a benchmark: one aiohttp session, one timed streaming request per prompt.

While a response streams, the only work per read is a perf_counter() and an append, so that
hundreds of concurrent streams on two cores still get honest timestamps. SSE parsing and
JSON decoding happen once the stream has ended (`parse_stream`), each event stamped with
the time of the read that completed it.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import msgspec

from rill.bench.serving.sse import SSEParser

_perf_counter = time.perf_counter  # a local name: looked up once, not per read


class RequestState(enum.Enum):
    NOT_SENT = "not_sent"  # cut by --max-duration before it left
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"  # in flight when the drain time after --max-duration ran out


@dataclass(slots=True)
class RequestOutput:  # vLLM's RequestFuncOutput, with units in the names
    prompt_len: int
    state: RequestState = RequestState.NOT_SENT
    error: str = ""
    start_s: float = 0.0  # perf_counter() when the request was sent
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    e2el_s: float = 0.0
    output_len: int = 0
    output_len_source: str = ""  # "usage" (the server's count) or "counted" (re-tokenized here)
    server_prompt_len: int | None = None
    generated_text: str = ""

    @property
    def success(self) -> bool:
        return self.state is RequestState.COMPLETED


# Only the fields a benchmark reads; msgspec skips the rest (logprobs, ids) without building them.
class _Delta(msgspec.Struct):
    role: str | None = None
    content: str | None = None
    reasoning_content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = None  # an OpenAI error object; any non-null value marks an error event


_decode_chunk = msgspec.json.Decoder(_Chunk).decode


def is_chat(endpoint: str) -> bool:
    return endpoint.rstrip("/").endswith("chat/completions")


def request_body(endpoint: str, model: str, prompt: str, output_len: int, *, ignore_eos: bool,
                 temperature: float, extra_body: dict) -> bytes:
    body: dict = {"model": model, "temperature": temperature, "stream": True,
                  "stream_options": {"include_usage": True}}
    if is_chat(endpoint):
        # Both names: newer servers read max_completion_tokens, older ones only max_tokens.
        body.update(messages=[{"role": "user", "content": prompt}], max_completion_tokens=output_len,
                    max_tokens=output_len)
    else:
        body.update(prompt=prompt, max_tokens=output_len)
    if ignore_eos:
        # ignore_eos for vLLM-style servers; min_tokens for those (llama.cpp) that ignore it.
        body.update(ignore_eos=True, min_tokens=output_len)
    body.update(extra_body)
    return msgspec.json.encode(body)


def auth_headers(api_key: str | None, extra: dict[str, str]) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return {**headers, **extra}


# A request whose connection fails before any answer is sent again, up to this many times, on another
# connection: llama.cpp's server closes a connection after each streamed response though it says keep-alive,
# and aiohttp, which pools it, does not resend a POST that failed to go out on it.
RESENDS = 3
_STALE_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def open_session(max_connections: int | None, timeout_s: float) -> aiohttp.ClientSession:
    """One session for the whole run; 0 connections means no limit (pure request-rate runs)."""
    connector = aiohttp.TCPConnector(limit=max_connections or 0, limit_per_host=max_connections or 0,
                                     ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s))


async def fetch_models(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]) -> list[dict]:
    async with session.get(f"{base_url}/v1/models", headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {base_url}/v1/models: HTTP {resp.status}: {(await resp.text())[:500]}")
        return (await resp.json()).get("data") or []


async def send_request(session: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str],
                       out: RequestOutput, *, require_done: bool = True) -> None:
    """POST one streaming request and fill `out`; never raises for the server's faults."""
    reads: list[tuple[float, bytes]] = []
    out.state = RequestState.FAILED  # until proven otherwise; a cancel overwrites it
    for attempt in range(RESENDS + 1):
        out.start_s = _perf_counter()
        answered = False
        try:
            async with session.post(url, data=body, headers=headers) as resp:
                answered = True
                if resp.status != 200:
                    out.error = f"HTTP {resp.status}: {(await resp.text(errors='replace'))[:1000]}"
                    return
                append = reads.append
                async for data in resp.content.iter_any():
                    append((_perf_counter(), data))
            break
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            if not answered and attempt < RESENDS and isinstance(exc, _STALE_CONNECTION):
                continue  # a pooled connection the server had closed: the request never reached it
            out.error = f"{type(exc).__name__}: {exc}" + (" (after part of the stream)" if reads else "")
            return
    parse_stream(out, reads, require_done=require_done)


def parse_stream(out: RequestOutput, reads: list[tuple[float, bytes]], *, require_done: bool = True) -> None:
    """Turn (timestamp, bytes) reads into TTFT, ITLs, E2EL, text and usage, as vLLM defines them.

    A token-bearing chunk is one with a choice, except a chat role opener (role set, no content,
    no finish_reason): Rill sends that before any token exists, so counting it, as vLLM does,
    would turn TTFT into the time to the HTTP headers. Without `require_done`, a stream that
    closes without `data: [DONE]` (transformers serve ends its streams so) still completes.
    """
    parser = SSEParser()
    last_token_s = 0.0
    num_token_chunks = 0
    texts: list[str] = []
    saw_done = False
    error = ""
    stamped = [(t, ev) for t, data in reads for ev in parser.feed(data)]
    stamped += [(reads[-1][0] if reads else out.start_s, ev) for ev in parser.close()]
    for t, ev in stamped:
        if ev.is_done:
            saw_done = True
            break
        try:
            chunk = _decode_chunk(ev.data)
        except msgspec.DecodeError as exc:
            error = error or f"bad SSE data ({exc}): {ev.data[:200]}"
            continue
        if chunk.error is not None or ev.event == "error":
            error = error or f"SSE error event: {ev.data[:1000]}"
            continue
        if chunk.usage is not None and chunk.usage.completion_tokens is not None:
            out.output_len = chunk.usage.completion_tokens
            out.output_len_source = "usage"
            out.server_prompt_len = chunk.usage.prompt_tokens
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        delta = choice.delta
        if choice.text is not None:
            text = choice.text
        elif delta is not None:
            text = (delta.content or "") + (delta.reasoning_content or "")
            if delta.role and not text and choice.finish_reason is None:
                continue
        else:
            text = ""
        if num_token_chunks == 0:
            out.ttft_s = t - out.start_s
        else:
            out.itl_s.append(t - last_token_s)
        num_token_chunks += 1
        last_token_s = t
        texts.append(text)
    out.generated_text = "".join(texts)
    out.e2el_s = last_token_s - out.start_s if num_token_chunks else 0.0
    if not error and not num_token_chunks:
        error = "the stream carried no token-bearing chunk"
    if not error and not saw_done and require_done:
        error = f"the stream ended without data: [DONE] (after {num_token_chunks} token chunks)"
    out.error = error
    out.state = RequestState.FAILED if error else RequestState.COMPLETED
