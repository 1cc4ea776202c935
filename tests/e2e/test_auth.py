"""API keys, CORS, X-Request-Id and keep-alive on one real `rill serve`.

The server has two keys, one from $RILL_API_KEY and one from a key file, --protect-metrics,
one allowed CORS origin, and a short keep-alive so that its expiry can be seen.
"""
from __future__ import annotations

import http.client
import re
import time

import anthropic
import httpx
import openai
import pytest

from tests.helpers.openapi import validate
from tests.helpers.server import start_server, stop_server

MODEL = "smollm2-135m-instruct"
ENV_KEY = "sk-env-7f3a9c"
FILE_KEY = "sk-file-41d2e8"
ORIGIN = "https://app.example"
MSGS = [{"role": "user", "content": "Say hi"}]
KEEP_ALIVE_S = 2
NO_FILE, NO_BATCH = "file-" + "0" * 32, "batch_" + "0" * 32  # well-shaped ids of nothing
NO_CHAT = "chatcmpl-" + "0" * 32


@pytest.fixture(scope="module")
def srv(model_dir, tmp_path_factory):
    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# the staging key\n\n  {FILE_KEY}  \n# sk-commented-out\n")
    server = start_server(tmp_path_factory, "--max-model-len", "512", "--kv-cache-memory", "64MiB",
                          "--api-key-file", str(key_file), "--protect-metrics", "--allowed-origins", ORIGIN,
                          "--timeout-keep-alive", str(KEEP_ALIVE_S), env={"RILL_API_KEY": ENV_KEY})
    yield server
    stop_server(server)
    log = server.log_path.read_text()
    assert ENV_KEY not in log and FILE_KEY not in log, "an API key reached the log"


def bearer(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def sdk(srv, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key=key, _strict_response_validation=True,
                         max_retries=0, timeout=60)


def check_401(resp: httpx.Response) -> dict:
    assert resp.status_code == 401, resp.text
    body = resp.json()
    validate("ErrorResponse", body)
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "invalid_api_key"
    assert body["error"]["param"] is None
    assert resp.headers["www-authenticate"] == "Bearer"
    assert resp.headers["x-request-id"]
    return body["error"]


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/models", None),
    ("GET", f"/v1/models/{MODEL}", None),
    ("POST", "/v1/chat/completions", {"model": MODEL, "messages": MSGS, "max_tokens": 2}),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
    ("GET", "/v1/no-such-route", None),  # no key: whether a route exists is not told either
    ("POST", "/v3/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),  # /v1's alias
    ("POST", "/tokenize", {"prompt": "Hi"}),  # vLLM leaves these open; they run the tokenizer
    ("POST", "/detokenize", {"tokens": [1, 2]}),
    ("POST", "/infill", {"input_prefix": "def f():", "n_predict": 2}),  # llama.cpp's; this model has no FIM: a 400
    ("POST", "/completion", {"prompt": "Hi", "n_predict": 2}),  # llama.cpp's native completion
    ("POST", "/invocations", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),  # SageMaker's: a completion
    # A generating model serves no rerank or score: a 400 naming `model` once the key is good.
    ("POST", "/v1/rerank", {"model": MODEL, "query": "Hi", "documents": ["Hello"]}),
    ("POST", "/v2/rerank", {"model": MODEL, "query": "Hi", "documents": ["Hello"]}),
    ("POST", "/rerank", {"query": "Hi", "documents": ["Hello"]}),
    ("POST", "/score", {"text_1": "Hi", "text_2": "Hello"}),
    ("POST", "/v1/score", {"text_1": "Hi", "text_2": "Hello"}),
    ("POST", "/classify", {"input": "Hi"}),  # nor classify
    ("POST", "/v1/classify", {"model": MODEL, "input": "Hi"}),
    ("POST", "/pooling", {"input": "Hi"}),  # nor pooling: this server has no --enable-embeddings
    ("POST", "/reset_prefix_cache", None),  # a 404 with the key: this server has no --enable-cache-reset
    ("GET", "/flush_cache", None),
    # The Batch API (docs/batch.md): with the key, what each answers to these bodies.
    ("GET", "/v1/files", None),
    ("POST", "/v1/files", None),  # not multipart: 415
    ("GET", f"/v1/files/{NO_FILE}", None),
    ("GET", f"/v1/files/{NO_FILE}/content", None),
    ("DELETE", f"/v1/files/{NO_FILE}", None),
    ("GET", "/v1/batches", None),
    ("POST", "/v1/batches", {"input_file_id": NO_FILE, "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
    ("GET", f"/v1/batches/{NO_BATCH}", None),
    ("POST", f"/v1/batches/{NO_BATCH}/cancel", None),
    # Stored chat completions (docs/stored-chat-completions.md): a list, and one that is not kept.
    ("GET", "/v1/chat/completions", None),
    ("GET", f"/v1/chat/completions/{NO_CHAT}", None),
    ("POST", f"/v1/chat/completions/{NO_CHAT}", {"metadata": {}}),
    ("DELETE", f"/v1/chat/completions/{NO_CHAT}", None),
    ("GET", f"/v1/chat/completions/{NO_CHAT}/messages", None),
])
def test_v1_needs_a_valid_key(srv, method, path, body):
    url = f"{srv.base_url}{path}"
    for headers in ({}, bearer("sk-wrong"), bearer(ENV_KEY[:-1]), bearer(ENV_KEY + "x"),
                    {"authorization": f"Basic {ENV_KEY}"}, {"authorization": "Bearer"}, {"authorization": ENV_KEY}):
        err = check_401(httpx.request(method, url, json=body, headers=headers, timeout=30))
        assert "sk-" not in err["message"], "the presented key is echoed back"
    ok = httpx.request(method, url, json=body, headers=bearer(FILE_KEY), timeout=60)
    refused = path == "/infill" or path.endswith(("/rerank", "/score", "/classify", "/pooling"))
    expected = 404 if "no-such" in path or NO_FILE in path or NO_BATCH in path or NO_CHAT in path \
        or (body or {}).get("input_file_id") \
        or path in ("/reset_prefix_cache", "/flush_cache") \
        else 415 if path == "/v1/files" and method == "POST" else 400 if refused else 200
    assert ok.status_code == expected, ok.text
    if path.endswith(("/rerank", "/score", "/classify", "/pooling")):
        assert ok.json()["error"]["param"] == "model"


def test_sdk_works_with_either_key(srv):
    for key in (ENV_KEY, FILE_KEY):
        resp = sdk(srv, key).chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, temperature=0)
        assert resp.choices[0].finish_reason in ("stop", "length")
        assert [m.id for m in sdk(srv, key).models.list()] == [MODEL]
    with pytest.raises(openai.AuthenticationError) as exc:
        sdk(srv, "sk-not-a-key").completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert exc.value.status_code == 401
    assert exc.value.code == "invalid_api_key"


def test_anthropic_clients_send_x_api_key(srv):
    """Anthropic's SDK sends its key as `x-api-key`; a wrong one gets Anthropic's error shape."""
    claude = anthropic.Anthropic(base_url=srv.base_url, api_key=ENV_KEY, max_retries=0, timeout=60,
                                 _strict_response_validation=True)
    message = claude.messages.create(model=MODEL, max_tokens=2, messages=MSGS)
    assert message.usage.output_tokens > 0
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=srv.base_url, api_key="sk-wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=MSGS)
    r = httpx.post(f"{srv.base_url}/v1/messages", json={"model": MODEL, "max_tokens": 2, "messages": MSGS},
                   headers={"x-api-key": "sk-wrong"}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    chat = httpx.post(f"{srv.base_url}/v1/chat/completions", json={"model": MODEL, "messages": MSGS, "max_tokens": 2},
                      headers={"x-api-key": FILE_KEY}, timeout=60)
    assert chat.status_code == 200  # the header works on every guarded route


def test_probes_stay_open_and_metrics_are_protected(srv):
    assert httpx.get(f"{srv.base_url}/health").status_code == 200
    assert httpx.get(f"{srv.base_url}/ready").status_code == 200
    assert httpx.get(f"{srv.base_url}/ping").status_code == 200  # SageMaker's probe
    for path in ("/stats", "/metrics", "/version"):  # what a scraper polls: keyed under --protect-metrics
        check_401(httpx.get(f"{srv.base_url}{path}"))
        check_401(httpx.get(f"{srv.base_url}{path}", headers=bearer("sk-wrong")))
    assert httpx.get(f"{srv.base_url}/stats", headers=bearer(ENV_KEY)).status_code == 200
    assert httpx.get(f"{srv.base_url}/metrics", headers=bearer(FILE_KEY)).status_code != 401


def preflight(srv, path: str, origin: str = ORIGIN, method: str = "POST", headers: str = "authorization, content-type"):
    return httpx.options(f"{srv.base_url}{path}", headers={
        "origin": origin, "access-control-request-method": method, "access-control-request-headers": headers})


def test_cors_preflight(srv):
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health"):
        resp = preflight(srv, path)  # no key: browsers never send one on a preflight
        assert resp.status_code == 204, resp.text
        assert resp.headers["access-control-allow-origin"] == ORIGIN
        assert {m.strip() for m in resp.headers["access-control-allow-methods"].split(",")} == {"GET", "POST"}
        # Echoed, since a "*" would not cover Authorization.
        assert resp.headers["access-control-allow-headers"] == "authorization, content-type"
        assert int(resp.headers["access-control-max-age"]) > 0
        assert resp.headers["vary"] == "Origin"
        assert resp.content == b""
    refused = preflight(srv, "/v1/chat/completions", origin="https://evil.example")
    assert refused.status_code == 403
    validate("ErrorResponse", refused.json())
    assert "access-control-allow-origin" not in refused.headers
    assert preflight(srv, "/v1/models", method="DELETE").status_code == 403
    # Not a preflight (no Access-Control-Request-Method): an ordinary request, which needs a key.
    check_401(httpx.options(f"{srv.base_url}/v1/models", headers={"origin": ORIGIN}))


def test_cors_headers_on_responses(srv):
    ok = httpx.get(f"{srv.base_url}/v1/models", headers={"origin": ORIGIN, **bearer(ENV_KEY)})
    assert ok.status_code == 200
    assert ok.headers["access-control-allow-origin"] == ORIGIN
    assert ok.headers["vary"] == "Origin"
    assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
    # A browser app must be able to read the 401 too.
    denied = httpx.get(f"{srv.base_url}/v1/models", headers={"origin": ORIGIN})
    check_401(denied)
    assert denied.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.get(f"{srv.base_url}/v1/models", headers={"origin": "https://evil.example", **bearer(ENV_KEY)})
    assert other.status_code == 200  # CORS is the browser's check; the server only withholds the header
    assert "access-control-allow-origin" not in other.headers
    assert "access-control-allow-origin" not in httpx.get(f"{srv.base_url}/health").headers


def test_request_id_echoed_on_200_4xx_and_streams(srv):
    url = f"{srv.base_url}/v1/chat/completions"
    cases = [
        ({"model": MODEL, "messages": MSGS, "max_tokens": 2}, bearer(ENV_KEY), 200),
        ({"model": MODEL, "messages": MSGS, "max_tokens": 0}, bearer(ENV_KEY), 400),
        ({"model": "gpt-17", "messages": MSGS}, bearer(ENV_KEY), 404),
        ({"model": MODEL, "messages": MSGS}, {}, 401),
    ]
    for i, (body, headers, status) in enumerate(cases):
        rid = f"trace-{i}-abc.DEF_123"
        resp = httpx.post(url, json=body, headers={"x-request-id": rid, **headers}, timeout=60)
        assert resp.status_code == status, resp.text
        assert resp.headers["x-request-id"] == rid
    with httpx.stream("POST", url, json={"model": MODEL, "messages": MSGS, "max_tokens": 3, "stream": True},
                      headers={"x-request-id": "stream-rid-1", **bearer(ENV_KEY)}, timeout=60) as resp:
        assert resp.status_code == 200
        assert resp.headers["x-request-id"] == "stream-rid-1"
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert "data: [DONE]" in list(resp.iter_lines())
    assert httpx.get(f"{srv.base_url}/health", headers={"x-request-id": "probe-1"}).headers["x-request-id"] == "probe-1"


def test_request_id_generated_when_missing_or_unusable(srv):
    seen = set()
    for headers in ({}, {}, {"x-request-id": "x" * 500}, {"x-request-id": ""}):
        rid = httpx.get(f"{srv.base_url}/v1/models", headers={**headers, **bearer(ENV_KEY)}).headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", rid), rid
        seen.add(rid)
    assert len(seen) == 4
    resp = sdk(srv, ENV_KEY).chat.completions.with_raw_response.create(model=MODEL, messages=MSGS, max_tokens=2)
    assert re.fullmatch(r"[0-9a-f]{32}", resp.headers["x-request-id"])


def test_keep_alive_timeout(srv):
    """An idle connection is reused within --timeout-keep-alive and closed by the server after it."""
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.read() == b"{}"
        sock = conn.sock
        time.sleep(KEEP_ALIVE_S / 4)
        conn.request("GET", "/health")
        assert conn.getresponse().read() == b"{}"
        assert conn.sock is sock, "the connection was not kept alive"
        time.sleep(KEEP_ALIVE_S * 2)
        sock.settimeout(5)
        assert sock.recv(1) == b"", "the idle connection is still open after the keep-alive timeout"
    finally:
        conn.close()
