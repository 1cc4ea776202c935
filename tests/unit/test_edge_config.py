"""API key sources and checks, CORS decisions, keep-alive and log formats, without a server."""
from __future__ import annotations

import argparse
import json
import logging
import sys

import pytest

from rill.asgi.errors import APIError
from rill.asgi.http.auth import ApiKeyGuard, KeyFileError, collect_api_keys, digest, read_key_file
from rill.asgi.http.cors import CorsPolicy, parse_list
from rill.cli import serve_parser
from rill.http_server import http1_settings
from rill.ipc.logs import JsonFormatter, TextFormatter


def serve_args(*argv: str):
    parser = argparse.ArgumentParser()
    serve_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["serve", *argv])


def test_key_file_skips_comments_and_blank_lines(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# prod\n\n  sk-one  \n\t# old: sk-two\nsk-three\n")
    assert read_key_file(str(path)) == ["sk-one", "sk-three"]


def test_key_file_errors_fail_closed(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("# nothing here\n\n")
    with pytest.raises(KeyFileError, match="no keys"):
        read_key_file(str(empty))
    with pytest.raises(KeyFileError, match="missing"):
        read_key_file(str(tmp_path / "missing"))


def test_keys_from_every_source(tmp_path):
    path = tmp_path / "keys"
    path.write_text("sk-file\nsk-flag\n")
    keys = collect_api_keys(["sk-flag"], [str(path)], {"RILL_API_KEY": "sk-env"})
    assert keys == ["sk-flag", "sk-env", "sk-file"]
    assert collect_api_keys(None, None, {}) == []
    assert collect_api_keys(None, None, {"RILL_API_KEY": "  "}) == []


def headers(key: str | None = None, scheme: str = "Bearer"):
    return [] if key is None else [(b"authorization", f"{scheme} {key}".encode())]


def test_guard_denies_by_default_but_probes_and_metrics():
    guard = ApiKeyGuard([digest("sk-a"), digest("sk-b")], protect_metrics=False)
    for key in ("sk-a", "sk-b"):
        guard.check("/v1/chat/completions", headers(key))
        guard.check("/v1/chat/completions", headers(key, scheme="bearer"))
    for bad in (headers(), headers("sk-c"), headers("sk-a", scheme="Basic"), headers("sk-ab"), headers("")):
        with pytest.raises(APIError) as exc:
            guard.check("/v1/models", bad)
        assert exc.value.status == 401 and exc.value.code == "invalid_api_key"
        assert exc.value.headers == [(b"www-authenticate", b"Bearer")]
    for path in ("/health", "/ready", "/metrics", "/stats", "/version", "/loads"):
        guard.check(path, headers())
    for path in ("/tokenize", "/server_info", "/no/such/path", "/", None):  # default deny; None: a `..` path
        with pytest.raises(APIError):
            guard.check(path, headers())
    protected = ApiKeyGuard([digest("sk-a")], protect_metrics=True)
    for path in ("/metrics", "/stats"):
        with pytest.raises(APIError):
            protected.check(path, headers())
        protected.check(path, headers("sk-a"))
    protected.check("/health", headers())
    ApiKeyGuard([]).check("/v1/models", headers())  # no keys: open


def test_guard_compares_against_every_key(monkeypatch):
    """No early exit: the first key matching still costs a comparison with every other one."""
    import rill.asgi.http.auth as auth

    calls = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append(b) or real(a, b))
    guard = ApiKeyGuard([digest(k) for k in ("sk-a", "sk-b", "sk-c")])
    guard.check("/v1/models", headers("sk-a"))
    assert len(calls) == 3


def test_cors_lists_and_policy():
    assert parse_list("https://a.example, https://b.example") == ["https://a.example", "https://b.example"]
    assert parse_list('["GET", "POST"]') == ["GET", "POST"]
    off = CorsPolicy()
    assert not off.enabled and off.response_headers([(b"origin", b"https://a.example")]) == []
    assert not off.is_preflight("OPTIONS", [(b"origin", b"x"), (b"access-control-request-method", b"POST")])
    policy = CorsPolicy(["https://a.example"], ["GET", "POST"], ["authorization", "content-type"])
    asked = [(b"origin", b"https://a.example"), (b"access-control-request-method", b"POST"),
             (b"access-control-request-headers", b"Authorization, X-Stainless-OS")]
    with pytest.raises(APIError) as exc:
        policy.preflight(asked)
    assert exc.value.status == 403 and "x-stainless-os" in exc.value.message
    ok = dict(policy.preflight(asked[:2]))
    assert ok[b"access-control-allow-headers"] == b"authorization, content-type"
    star = CorsPolicy(["*"])
    assert dict(star.response_headers([(b"origin", b"https://z.example")])) == {
        b"access-control-allow-origin": b"*", b"access-control-expose-headers": b"x-request-id"}


def test_keep_alive_flag_reaches_granian():
    args = serve_args()
    assert args.timeout_keep_alive >= 120  # longer than what proxies hold an idle connection
    assert http1_settings(args.timeout_keep_alive).header_read_timeout == 125_000
    assert http1_settings(30).keep_alive and http1_settings(30).header_read_timeout == 30_000
    assert http1_settings(0).keep_alive is False
    assert args.allowed_origins == [] and args.log_format == "text" and not args.log_requests
    assert serve_args("--allowed-origins", "https://a.example,https://b.example").allowed_origins == [
        "https://a.example", "https://b.example"]
    assert serve_args("--api-key", "a", "--api-key", "b").api_key == ["a", "b"]


def record(**extra) -> logging.LogRecord:
    rec = logging.LogRecord("rill.access", logging.INFO, __file__, 1, "GET %s %d", ("/v1/models", 200), None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_formats():
    fields = {"request_id": "r 1", "model": None, "output_tokens": 3, "finish_reason": "stop", "disconnected": False}
    text = TextFormatter().format(record(fields=fields))
    assert text.endswith('rill.access: GET /v1/models 200 request_id="r 1" output_tokens=3 finish_reason=stop')
    entry = json.loads(JsonFormatter().format(record(fields=fields)))
    assert entry["message"] == "GET /v1/models 200" and entry["level"] == "INFO"
    assert entry["logger"] == "rill.access" and entry["model"] is None and entry["disconnected"] is False
    assert json.loads(JsonFormatter().format(record(request_id="abc")))["request_id"] == "abc"
    assert TextFormatter().format(record(request_id="abc")).endswith(" request_id=abc")
    try:
        raise ValueError("boom\nline two")
    except ValueError:
        rec = record(exc_info=sys.exc_info())
    line = JsonFormatter().format(rec)
    assert "\n" not in line and "ValueError: boom" in json.loads(line)["exc_info"]
