"""The Batch API's input checks: JSONL lines as OpenAI validates them, the multipart parser's
bounds, and the pacing rule that keeps batch work below interactive requests."""
from __future__ import annotations

import json

import pytest

from rill.asgi.batch import multipart
from rill.asgi.batch.jsonl import MAX_ERRORS, parse_lines
from rill.asgi.batch.pacing import allowed_lines
from rill.asgi.errors import APIError

URL = "/v1/chat/completions"


def row(custom_id="a", model="m", url=URL, method="POST", **body) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": method, "url": url,
                       "body": {"model": model, "messages": [], **body}}).encode()


def codes(data: bytes, max_lines: int = 100) -> list[tuple]:
    return [(e["line"], e["code"], e["param"]) for e in parse_lines(data, URL, max_lines)[1]]


def test_good_lines_keep_their_bodies_as_sent():
    lines, errors = parse_lines(b"\n".join([row("a"), b"", b"  ", row("b", temperature=0)]) + b"\n", URL, 10)
    assert errors == []
    assert [(x.number, x.custom_id, x.model) for x in lines] == [(1, "a", "m"), (4, "b", "m")]
    assert json.loads(lines[1].body) == {"model": "m", "messages": [], "temperature": 0}


@pytest.mark.parametrize("bad,expected", [
    (b"{not json", (1, "invalid_json_line", None)),
    (b"[1, 2]", (1, "invalid_json_line", None)),
    (b"\xff\xfe", (1, "invalid_json_line", None)),
    (b"[" * 100_000, (1, "invalid_json_line", None)),  # nesting: an error, never a RecursionError
    (row(custom_id=""), (1, "invalid_request", "custom_id")),
    (row(custom_id=7), (1, "invalid_request", "custom_id")),
    (row(custom_id="x" * 513), (1, "invalid_request", "custom_id")),
    (row(method="GET"), (1, "invalid_request", "method")),
    (row(url="/v1/completions"), (1, "invalid_url", "url")),
    (row(url="../../v1/chat/completions"), (1, "invalid_url", "url")),
    (row(model=None), (1, "missing_required_parameter", "body.model")),
    (row(stream=True), (1, "invalid_request", "body.stream")),
    (json.dumps({"custom_id": "a", "method": "POST", "url": URL, "body": "text"}).encode(), (1, "invalid_request", "body")),
    (json.dumps({"custom_id": "a", "method": "POST", "url": URL}).encode(), (1, "invalid_request", "body")),
])
def test_a_bad_line_fails_the_batch_naming_it(bad, expected):
    assert codes(bad) == [expected]


def test_duplicates_models_counts_and_empty_files():
    assert codes(b"\n".join([row("a"), row("b"), row("a")])) == [(3, "duplicate_custom_id", "custom_id")]
    assert codes(b"\n".join([row("a"), row("b", model="other")])) == [(2, "mismatched_model", "body.model")]
    assert codes(b"\n".join(row(str(i)) for i in range(4)), max_lines=3) == [(4, "too_many_requests", None)]
    assert codes(b"") == [(None, "empty_file", "input_file_id")]
    assert codes(b"\n\n") == [(None, "empty_file", "input_file_id")]
    assert len(codes(b"\n".join([b"{"] * (MAX_ERRORS + 50)))) == MAX_ERRORS


def form(*parts: tuple[str, str | None, bytes], boundary: str = "XyZ") -> tuple[bytes, str]:
    out = b""
    for name, filename, data in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{boundary}\r\nContent-Disposition: {disposition}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def test_multipart_reads_the_sdks_form():
    body, content_type = form(("purpose", None, b"batch"), ("file", "in.jsonl", b'{"a": 1}\r\n--XyZnot-a-delimiter\n'))
    parts = multipart.parse(body, content_type)
    assert parts["purpose"].data == b"batch" and parts["purpose"].filename is None
    assert parts["file"].filename == "in.jsonl" and parts["file"].data == b'{"a": 1}\r\n--XyZnot-a-delimiter\n'
    quoted, content_type = form(("file", 'a \\"b\\".jsonl', b"x"), boundary="b-1")
    assert multipart.parse(quoted, 'multipart/form-data; boundary="b-1"')["file"].filename == 'a "b".jsonl'


@pytest.mark.parametrize("body,content_type,status", [
    (b"x", "application/json", 415),
    (b"x", "multipart/form-data", 400),  # no boundary
    (b"x", "multipart/form-data; boundary=" + "b" * 71, 400),
    (b"no delimiter at all", "multipart/form-data; boundary=XyZ", 400),
    (b"--XyZ\r\nContent-Disposition: form-data; name=a\r\n\r\nnever closed", "multipart/form-data; boundary=XyZ", 400),
    (b"--XyZ\r\n" + b"H: " + b"v" * 9000 + b"\r\n\r\nx\r\n--XyZ--", "multipart/form-data; boundary=XyZ", 400),
    (b"--XyZ\r\nContent-Type: text/plain\r\n\r\nx\r\n--XyZ--", "multipart/form-data; boundary=XyZ", 400),
    (b"--XyZ\r\nContent-Disposition: form-data\r\n\r\nx\r\n--XyZ--", "multipart/form-data; boundary=XyZ", 400),
    (b"--XyZjunk", "multipart/form-data; boundary=XyZ", 400),
])
def test_multipart_refuses_malformed_bodies(body, content_type, status):
    with pytest.raises(APIError) as exc:
        multipart.parse(body, content_type)
    assert exc.value.status == status


def test_multipart_bounds_the_number_of_parts():
    body, content_type = form(*[(f"f{i}", None, b"v") for i in range(multipart.MAX_PARTS + 1)])
    with pytest.raises(APIError, match="at most"):
        multipart.parse(body, content_type)
    body, content_type = form(*[(f"f{i}", None, b"v") for i in range(multipart.MAX_PARTS)])
    assert len(multipart.parse(body, content_type)) == multipart.MAX_PARTS


def test_pacing_goes_below_interactive_requests():
    assert allowed_lines(num_running=0, num_waiting=0, in_flight=0, concurrency=4) == 4
    assert allowed_lines(num_running=3, num_waiting=0, in_flight=3, concurrency=4) == 4  # only the batch runs
    assert allowed_lines(num_running=4, num_waiting=0, in_flight=3, concurrency=4) == 1  # someone else runs
    assert allowed_lines(num_running=1, num_waiting=1, in_flight=0, concurrency=4) == 0  # someone waits
    assert allowed_lines(num_running=0, num_waiting=2, in_flight=2, concurrency=4) == 0
