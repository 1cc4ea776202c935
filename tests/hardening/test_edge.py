"""Hardening: the HTTP edge. Odd paths never skip the key, unknown paths are keyed too, probe
paths follow --protect-metrics, a POST body must say it is JSON, ids of the wrong shape never
reach the state store, and a client's text cannot forge a log line.

One keyed server (--api-key, --protect-metrics) whose state store is a file that is not a
database: every request that reaches the store gets 503 `store_unavailable`, so a 404 proves it
did not.
"""
from __future__ import annotations

import http.client
import json
import re
import time

import pytest

from rill.asgi.http.access_log import loggable
from rill.asgi.http.paths import normalize
from tests.helpers.openapi import validate
from tests.helpers.server import TINY_MODEL, start_server, stop_server

KEY = "sk-edge-5b1e07"
CONV = "conv_" + "a1" * 16
RESP = "resp_" + "b2" * 16
ITEM = "msg_" + "c3" * 16
FORGED = "2031-01-01 00:00:00,000 INFO rill.access: GET /forged 200"


@pytest.fixture(scope="module")
def edge(model_dir, tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    broken = tmp_path_factory.mktemp("broken-store") / "state.db"
    broken.write_bytes(b"not a database at all " * 500)
    srv = start_server(tmp_path_factory, "--model", str(tiny), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--max-model-len", "256", "--kv-cache-memory", "64MiB", "--api-key", KEY,
                       "--protect-metrics", "--state-store", f"sqlite://{broken}",
                       "--log-level", "info")
    yield srv
    stop_server(srv)
    assert KEY not in srv.log_path.read_text(), "the API key reached the log"


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def error(self) -> dict:
        body = json.loads(self.body)
        validate("ErrorResponse", body)
        return body["error"]


def raw(srv, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
        key: bool = False) -> Answer:
    """The request with `path` sent exactly as written (httpx would tidy it up first)."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    try:
        all_headers = {**(headers or {}), **({"authorization": f"Bearer {KEY}"} if key else {})}
        conn.request(method, path, body=body, headers=all_headers)
        resp = conn.getresponse()
        return Answer(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def check_401(answer: Answer) -> None:
    assert answer.status == 401, answer.body
    assert answer.error()["code"] == "invalid_api_key"
    assert answer.headers["www-authenticate"] == "Bearer"


# Every parameterised route, GET and DELETE ones first, and the spellings of its path that the
# router accepts: doubled, trailing and leading slashes, the /v3 and bare aliases.
PARAM_ROUTES = [
    ("GET", f"/v1/models/{TINY_MODEL}"),
    ("GET", f"/v1/responses/{RESP}"),
    ("DELETE", f"/v1/responses/{RESP}"),
    ("GET", f"/v1/responses/{RESP}/input_items"),
    ("POST", f"/v1/responses/{RESP}/cancel"),
    ("GET", f"/v1/conversations/{CONV}"),
    ("POST", f"/v1/conversations/{CONV}"),
    ("DELETE", f"/v1/conversations/{CONV}"),
    ("GET", f"/v1/conversations/{CONV}/items"),
    ("POST", f"/v1/conversations/{CONV}/items"),
    ("GET", f"/v1/conversations/{CONV}/items/{ITEM}"),
    ("DELETE", f"/v1/conversations/{CONV}/items/{ITEM}"),
]


def spellings(path: str) -> list[str]:
    rest = path[len("/v1/"):]
    out = ["/" + path, "//" + path, path.replace("/v1/", "/v1//", 1), path + "/", path + "//",
           "//v3/" + rest, "/v3//" + rest]
    if rest.startswith(("responses", "conversations")):
        out += ["//" + rest, "/" + rest.replace("/", "//")]
    return out


@pytest.mark.parametrize("method,path", PARAM_ROUTES, ids=[f"{m} {p}" for m, p in PARAM_ROUTES])
def test_odd_spellings_of_a_path_do_not_skip_the_key(edge, method, path):
    body = b"{}" if method == "POST" else None
    headers = {"content-type": "application/json"} if body else {}
    for spelled in [path, *spellings(path)]:
        check_401(raw(edge, method, spelled, body, headers))
        keyed = raw(edge, method, spelled, body, headers, key=True)  # the same route, now reached
        wanted = 200 if "/models/" in path else 503  # the broken store answers every stored-state route
        assert keyed.status == wanted, (spelled, keyed.body)


@pytest.mark.parametrize("path", ["/nope", "/v2/models", "/healthz", "/health/x", "/v1", "/v1/nothing",
                                  "/v1/./models", "/v1/models/../models", "/v1/%2e%2e/v1/models", "/tokenize/x"])
def test_unknown_paths_need_the_key_and_then_are_404(edge, path):
    check_401(raw(edge, "GET", path))
    check_401(raw(edge, "DELETE", path))
    keyed = raw(edge, "GET", path, key=True)
    assert keyed.status == 404, (path, keyed.body)
    assert keyed.error()["code"] == "not_found"


@pytest.mark.parametrize("path", ["/metrics", "/stats", "/version", "/loads", "/v1/loads", "/server_info",
                                  "/get_server_info", "/model_info", "/get_model_info"])
def test_probe_paths_need_the_key_under_protect_metrics(edge, path):
    for spelled in (path, path + "/", "/" + path):
        check_401(raw(edge, "GET", spelled))
        check_401(raw(edge, "GET", spelled, headers={"authorization": "Bearer sk-wrong"}))
    assert raw(edge, "GET", path, key=True).status == 200


def test_health_and_ready_stay_open(edge):
    for path in ("/health", "/ready", "//health", "/ready/"):
        assert raw(edge, "GET", path).status == 200, path


def test_a_post_body_must_be_declared_json(edge):
    body = json.dumps({"model": TINY_MODEL, "prompt": "Hi", "max_tokens": 2}).encode()
    for content_type in (None, "", "text/plain", "application/x-www-form-urlencoded", "text/json"):
        headers = {} if content_type is None else {"content-type": content_type}
        answer = raw(edge, "POST", "/v1/completions", body, headers, key=True)
        assert answer.status == 415, (content_type, answer.body)
        assert answer.error()["code"] == "unsupported_media_type"
    no_type = raw(edge, "POST", "/v1/chat/completions", b'{"model": "x", "messages": []}', key=True)
    assert no_type.status == 415  # refused before the body is decoded or checked
    for content_type in ("application/json", "application/json; charset=utf-8", "Application/JSON",
                         "application/vnd.api+json"):
        answer = raw(edge, "POST", "/v1/completions", body, {"content-type": content_type}, key=True)
        assert answer.status == 200, (content_type, answer.body)
    # No body at all says nothing to decode: a bodiless cancel is routed (to the broken store).
    assert raw(edge, "POST", f"/v1/responses/{RESP}/cancel", key=True).status == 503


@pytest.mark.parametrize("method,path", [
    ("DELETE", "/v1/conversations/index"),  # the Redis store's count index, once
    ("GET", "/v1/conversations/index/items"),
    ("DELETE", "/v1/responses/index"),
    ("GET", "/v1/responses/input_items"),
    ("GET", f"/v1/conversations/{CONV}:items"),
    ("GET", "/v1/conversations/conv_*"),
    ("GET", "/v1/conversations/conv_%2A"),
    ("GET", f"/v1/responses/{RESP}x%00"),
    ("GET", "/v1/responses/resp_" + "a" * 129),
    ("GET", f"/v1/responses/{CONV}"),  # a conversation's id is not a response's
    ("DELETE", f"/v1/conversations/{RESP}"),
    ("GET", f"/v1/conversations/{CONV}/items/a:b"),
    ("DELETE", f"/v1/conversations/{CONV}/items/" + "m" * 200),
    ("DELETE", f"/v1/conversations/{CONV}/items/msg_" + "m" * 129),
    ("GET", f"/v1/conversations/{CONV}/items/{ITEM}.json"),
    ("GET", "/v1/conversations/conv_%C3%A9"),
])
def test_ids_of_the_wrong_shape_are_404_before_the_store(edge, method, path):
    answer = raw(edge, method, path, key=True)
    assert answer.status in (404, 405), (path, answer.body)  # 405: a literal path such as input_items
    assert answer.error()["code"] in ("not_found", "method_not_allowed")


def test_ids_of_the_right_shape_reach_the_store(edge):
    for method, path in PARAM_ROUTES[1:]:
        body = b"{}" if method == "POST" else None
        answer = raw(edge, method, path, body, {"content-type": "application/json"} if body else {}, key=True)
        assert answer.status == 503 and answer.error()["code"] == "store_unavailable", (method, path)


def test_model_ids_are_bounded(edge):
    for path in ("/v1/models/" + "m" * 300, "/v1/models/a%01b", "/v1/models/a%7Fb"):
        answer = raw(edge, "GET", path, key=True)
        assert answer.status == 404, (path, answer.body)
        assert TINY_MODEL not in answer.error()["message"]
    assert raw(edge, "GET", "/v1/models/no-such/model", key=True).error()["code"] == "model_not_found"


def access_lines(srv, marker: str, timeout_s: float = 5.0) -> list[str]:
    """The server log's lines, once a line holding `marker` is in it (the access line goes out
    after the response, so it may lag the answer a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = srv.log_path.read_text(errors="replace")
        if marker in text or time.monotonic() > deadline:
            return text.splitlines()
        time.sleep(0.05)


def test_control_characters_in_the_path_do_not_forge_log_lines(edge):
    forged = FORGED.replace(" ", "%20")
    for sep in ("%0A", "%0D", "%0D%0A", "%E2%80%A8", "%C2%85", "%1B[2K"):
        raw(edge, "GET", f"/v1/models/edge-marker{sep}{forged}")  # 401: still logged
        raw(edge, "GET", f"/edge-marker-unknown{sep}{forged}", key=True)
    lines = access_lines(edge, "edge-marker-unknown")
    assert any("edge-marker" in line for line in lines)
    assert not [line for line in lines if "rill.access: GET /forged" in line.split("edge-marker")[0]]
    assert not [line for line in lines if line.startswith(FORGED[:10])], "a forged log line"
    assert "\x1b" not in "\n".join(lines)


def test_a_client_request_id_is_echoed_only_when_plain(edge):
    for rid in ("abc def", 'a"b', "a\tb", "x" * 129, "é"):
        answer = raw(edge, "GET", "/health", headers={"x-request-id": rid.encode("latin-1").decode("latin-1")})
        assert re.fullmatch(r"[0-9a-f]{32}", answer.headers["x-request-id"]), rid
    for rid in ("trace-0-abc.DEF_123", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1"):
        assert raw(edge, "GET", "/health", headers={"x-request-id": rid}).headers["x-request-id"] == rid


def test_paths_normalize_once():
    assert normalize("//v1//models/") == "/v1/models"
    assert normalize("/v3/chat/completions") == "/v1/chat/completions"
    assert normalize("/v3") == "/v1"
    assert normalize("//responses/x") == "/v1/responses/x"
    assert normalize("/conversations") == "/v1/conversations"
    assert normalize("/responsesx") == "/responsesx"  # an alias is a whole segment
    assert normalize("/") == normalize("") == normalize("//") == "/"
    for dotted in ("/v1/./models", "/v1/models/..", "/../health", "/v1/models/org/../x"):
        assert normalize(dotted) is None, dotted


def test_log_text_is_escaped():
    assert loggable("/a\nb\r\x00\x1b\u2028\x85c") == "/a\\nb\\r\\x00\\x1b\\u2028\\x85c"
    assert loggable("GET") == "GET" and loggable("/v1/ünïcode") == "/v1/ünïcode"
    assert loggable("a\\nb") == "a\\\\nb"  # a literal backslash-n cannot pass for an escaped newline
    long = loggable("x" * 5000)
    assert len(long) < 1100 and long.endswith("...")
