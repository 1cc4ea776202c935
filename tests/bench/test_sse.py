"""bench/serving/sse.py's incremental parser, and bench/serving/client.py's reading of a finished stream."""
from __future__ import annotations

import pytest

from rill.bench.serving.client import RequestOutput, RequestState, parse_stream
from rill.bench.serving.sse import SSEEvent, SSEParser


def parse_all(chunks: list[bytes]) -> tuple[list[SSEEvent], SSEParser]:
    parser = SSEParser()
    events = [ev for chunk in chunks for ev in parser.feed(chunk)]
    return events + parser.close(), parser


def byte_by_byte(stream: bytes) -> list[bytes]:
    return [stream[i:i + 1] for i in range(len(stream))]


def datas(events: list[SSEEvent]) -> list[str]:
    return [ev.data for ev in events]


STREAM = (b': keep-alive\n\n'
          b'data: {"choices":[{"text":"Hel"}]}\n\n'
          b'data: {"choices":[{"text":"lo \xc3\xa9"}]}\n\n'
          b': keep-alive\n\n'
          b'data: [DONE]\n\n')
EXPECTED = ['{"choices":[{"text":"Hel"}]}', '{"choices":[{"text":"lo \u00e9"}]}', "[DONE]"]


def test_whole_stream_in_one_read():
    events, parser = parse_all([STREAM])
    assert datas(events) == EXPECTED
    assert parser.num_comments == 2
    assert events[-1].is_done and not events[0].is_done


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending_fed_byte_by_byte(line_end):
    stream = STREAM.replace(b"\n", line_end)
    whole, _ = parse_all([stream])
    split, parser = parse_all(byte_by_byte(stream))  # splits CRLF pairs and a UTF-8 character too
    assert datas(whole) == datas(split) == EXPECTED
    assert parser.num_comments == 2


def test_event_split_across_reads_at_every_position():
    for cut in range(1, len(STREAM)):
        events, _ = parse_all([STREAM[:cut], STREAM[cut:]])
        assert datas(events) == EXPECTED, cut


def test_multi_line_data_is_joined_with_lf():
    events, _ = parse_all([b"data: first\ndata:second\ndata:  third\n\n"])
    assert datas(events) == ["first\nsecond\n third"]  # only one space after the colon is dropped


def test_event_name_id_retry_and_unknown_fields():
    events, _ = parse_all([b"event: error\nid: 7\nretry: 100\nfoo: bar\ndata: {}\n\ndata: x\n\n"])
    assert [(e.event, e.id, e.data) for e in events] == [("error", "7", "{}"), ("message", "7", "x")]


def test_blank_lines_without_data_dispatch_nothing():
    events, _ = parse_all([b"\n\n\r\n: only a comment\n\nevent: ping\n\n"])
    assert events == []


def test_leading_bom_is_dropped():
    events, _ = parse_all([b"\xef\xbb\xbfdata: a\n\n"])
    assert datas(events) == ["a"]


def test_unterminated_last_event_is_dispatched_on_close():
    parser = SSEParser()
    assert parser.feed(b'data: {"a": 1}\n\ndata: [DONE]') == [SSEEvent('{"a": 1}')]
    assert datas(parser.close()) == ["[DONE]"]


# parse_stream: reads are (perf_counter seconds, bytes); the request was sent at start_s.

def completion_chunk(text: str, finish: str | None = None) -> bytes:
    finish_json = "null" if finish is None else f'"{finish}"'
    return f'data: {{"choices":[{{"index":0,"text":"{text}","finish_reason":{finish_json}}}]}}\n\n'.encode()


USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}\n\n'
DONE = b"data: [DONE]\n\n"


def run(reads: list[tuple[float, bytes]]) -> RequestOutput:
    out = RequestOutput(prompt_len=5, start_s=10.0)
    parse_stream(out, reads)
    return out


def test_completion_stream_timings_text_and_usage():
    out = run([(10.5, b": keep-alive\n\n"), (11.0, completion_chunk("a")), (11.25, completion_chunk("b")),
               (11.75, completion_chunk("c", "length") + USAGE + DONE)])
    assert out.state is RequestState.COMPLETED and out.error == ""
    assert out.ttft_s == pytest.approx(1.0)  # the keep-alive comment is not a token
    assert out.itl_s == pytest.approx([0.25, 0.5])
    assert out.e2el_s == pytest.approx(1.75)
    assert out.generated_text == "abc"
    assert (out.output_len, out.output_len_source, out.server_prompt_len) == (3, "usage", 5)


def test_chat_role_opener_is_not_the_first_token():
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
    token = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}\n\n'
    finish = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    out = run([(10.1, role), (12.0, token), (12.5, token), (13.0, finish + DONE)])
    assert out.success
    assert out.ttft_s == pytest.approx(2.0)
    assert out.itl_s == pytest.approx([0.5, 0.5])
    assert out.e2el_s == pytest.approx(3.0)
    assert out.generated_text == "HiHi"
    assert out.output_len_source == ""  # no usage: the caller counts tokens itself


def test_events_completed_in_one_read_share_its_timestamp():
    stream = completion_chunk("a") + completion_chunk("b") + DONE
    out = run([(10.2, stream[:10]), (10.4, stream[10:])])
    assert out.ttft_s == pytest.approx(0.4)
    assert out.itl_s == pytest.approx([0.0])


def test_missing_done_is_an_error():
    out = run([(11.0, completion_chunk("a")), (11.5, completion_chunk("b", "length"))])
    assert out.state is RequestState.FAILED
    assert "[DONE]" in out.error


def test_error_event_is_an_error():
    error = b'data: {"error":{"message":"engine died","type":"server_error","param":null,"code":"engine_error"}}\n\n'
    out = run([(11.0, completion_chunk("a")), (11.5, error + DONE)])
    assert out.state is RequestState.FAILED
    assert "engine died" in out.error


def test_named_error_event_and_bad_json_are_errors():
    assert "SSE error" in run([(11.0, b"event: error\ndata: {}\n\n" + DONE)]).error
    assert "bad SSE data" in run([(11.0, b"data: {not json\n\n" + DONE)]).error


def test_stream_without_tokens_is_an_error():
    out = run([(11.0, USAGE + DONE)])
    assert out.state is RequestState.FAILED
    assert "no token" in out.error


def test_a_request_on_a_connection_the_server_closed_is_sent_again():
    """As llama.cpp's server does: each streamed answer says keep-alive, then the server closes the socket.
    aiohttp pools the connection, and the next POST on it fails before anything is sent: it goes again."""
    import asyncio

    from rill.bench.serving.client import open_session, send_request

    stream = b'data: {"choices":[{"index":0,"text":"hi","finish_reason":null}]}\n\ndata: [DONE]\n\n'
    answer = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\n"
              b"Keep-Alive: timeout=5, max=100\r\nContent-Length: %d\r\n\r\n" % len(stream)) + stream
    served = []

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")  # the headers, then a small body that fits the first read
        await reader.read(65536)
        served.append(1)
        writer.write(answer)
        await writer.drain()
        await asyncio.sleep(0.02)  # the client has sent its next request on this connection by now
        writer.close()  # though it said keep-alive, and without answering that request

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        outs = [RequestOutput(prompt_len=1) for _ in range(4)]
        async with open_session(1, 10.0) as session:
            for out in outs:
                await send_request(session, f"http://127.0.0.1:{port}/v1/completions", b"{}", {}, out)
        server.close()
        return outs

    outs = asyncio.run(main())
    assert [o.state for o in outs] == [RequestState.COMPLETED] * 4, [o.error for o in outs]
    assert len(served) == 4
