"""The access log and the log formats on a real `rill serve`: text, and json with --log-requests.

The same traffic goes to each server through the SDK: a completion, a streamed chat, a model
list, and a 400. Each request carries an X-Request-Id and a prompt with a marker word,
which must never reach the log unless --log-requests.
"""
from __future__ import annotations

import json
import re
import time
import uuid

import httpx
import openai
import pytest

from tests.helpers.server import start_servers, stop_server

MODEL = "smollm2-135m-instruct"
TEXT_LINE = re.compile(r"^\S+ \S+ (?P<level>[A-Z]+) (?P<logger>[\w.]+): (?P<message>.*)$")
PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')
ACCESS = re.compile(r"^(?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d+)(?P<pairs>.*)$")


@pytest.fixture(scope="module")
def log_servers(model_dir, tmp_path_factory):
    """format -> its server, both started at once (their starts overlap): json also has --log-requests."""
    common = ("--max-model-len", "512", "--kv-cache-memory", "64MiB", "--log-level", "info")
    servers = dict(zip(["text", "json"], start_servers(tmp_path_factory, common,
                                                       (*common, "--log-format", "json", "--log-requests"))))
    try:
        yield servers
    finally:
        for server in servers.values():
            stop_server(server)
    assert not_json(servers["json"].log_path.read_text()) == []  # the shutdown lines too


@pytest.fixture(scope="module", params=["text", "json"])
def logged(request, log_servers):
    """(format, server, traffic)."""
    server = log_servers[request.param]
    return request.param, server, send_traffic(server)


def send_traffic(server) -> dict:
    tag = uuid.uuid4().hex[:8]
    t = {name: f"{name}-{tag}" for name in ("cmpl", "chat", "models", "bad")}
    t["secrets"] = {name: f"zebra{name}marmalade{tag}" for name in ("cmpl", "chat", "bad")}
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", _strict_response_validation=True,
                           max_retries=0, timeout=60)
    client.completions.create(model=MODEL, prompt=f"Repeat: {t['secrets']['cmpl']}", max_tokens=4, temperature=0,
                              extra_headers={"x-request-id": t["cmpl"]})
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"Once upon a time {t['secrets']['chat']}"}],
        max_tokens=5, temperature=0, stream=True, stream_options={"include_usage": True},
        extra_body={"ignore_eos": True}, extra_headers={"x-request-id": t["chat"]}))
    assert chunks[-1].usage.completion_tokens == 5
    assert [m.id for m in client.models.list(extra_headers={"x-request-id": t["models"]})] == [MODEL]
    bad = httpx.post(f"{server.base_url}/v1/chat/completions", headers={"x-request-id": t["bad"]}, json={
        "model": MODEL, "messages": [{"role": "user", "content": t["secrets"]["bad"]}], "max_tokens": 0})
    assert bad.status_code == 400
    return t


def parse(fmt: str, line: str) -> dict:
    """One log line as {level, logger, message, **fields}."""
    if fmt == "json":
        return json.loads(line)
    match = TEXT_LINE.match(line)
    assert match, f"not a log line: {line!r}"
    entry = match.groupdict()
    if entry["logger"] == "rill.access":
        access = ACCESS.match(entry["message"])
        entry.update(method=access["method"], path=access["path"], status=int(access["status"]))
        for key, value in PAIR.findall(access["pairs"]):
            entry[key] = json.loads(value) if value.startswith('"') else value
    return entry


def access_lines(fmt: str, server, request_ids: list[str], timeout_s: float = 10.0) -> dict[str, list[dict]]:
    """The access lines of these requests, waiting for them (they go out after the response)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = {rid: [] for rid in request_ids}
        for line in server.log_path.read_text().splitlines():
            if "rill.access" in line:
                entry = parse(fmt, line)
                if entry.get("request_id") in found:
                    found[entry["request_id"]].append(entry)
        if all(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def number(value) -> float:
    return float(value)


def test_one_access_line_per_request(logged):
    fmt, server, t = logged
    lines = access_lines(fmt, server, [t["cmpl"], t["chat"], t["models"], t["bad"]])
    assert all(len(found) == 1 for found in lines.values()), lines
    cmpl, chat, models, bad = (lines[t[k]][0] for k in ("cmpl", "chat", "models", "bad"))
    for entry, path in ((cmpl, "/v1/completions"), (chat, "/v1/chat/completions")):
        assert entry["level"] == "INFO" and entry["logger"] == "rill.access"
        assert entry["model"] == MODEL
        if fmt == "json":
            assert entry["message"] == f"POST {path} 200"
        else:
            assert (entry["method"], entry["path"], entry["status"]) == ("POST", path, 200)
        assert int(entry["prompt_tokens"]) > 3
        assert entry["finish_reason"] in ("stop", "length")
        assert 0 < number(entry["ttft_ms"]) <= number(entry["duration_ms"])
    assert 1 <= int(cmpl["output_tokens"]) <= 4
    assert int(chat["output_tokens"]) == 5 and chat["finish_reason"] == "length"
    for entry, status in ((models, 200), (bad, 400)):
        assert entry.get("model") is None and entry.get("finish_reason") is None
        assert entry.get("ttft_ms") is None and number(entry["duration_ms"]) >= 0
        assert (entry["message"].split()[-1] if fmt == "json" else str(entry["status"])) == str(status)


def test_prompt_text_only_with_log_requests(logged):
    fmt, server, t = logged
    access_lines(fmt, server, [t["bad"]])  # everything has been logged by now
    log = server.log_path.read_text()
    if fmt == "text":  # no --log-requests
        for secret in t["secrets"].values():
            assert secret not in log
        return
    carriers = [parse(fmt, line) for line in log.splitlines() if t["secrets"]["cmpl"] in line
                or t["secrets"]["chat"] in line]
    assert {(e["logger"], e["level"]) for e in carriers} == {("rill.requests", "DEBUG")}
    by_id = {e["request_id"]: e["request"] for e in carriers}
    assert t["secrets"]["cmpl"] in by_id[t["cmpl"]]["prompt"]
    assert t["secrets"]["chat"] in by_id[t["chat"]]["messages"][0]["content"]
    assert t["secrets"]["bad"] not in log  # refused before it was decoded into a request


def not_json(log: str) -> list[str]:
    bad = []
    for line in log.splitlines():
        try:
            assert isinstance(json.loads(line), dict)
        except (ValueError, AssertionError):
            bad.append(line)
    return bad


def test_json_every_line_of_every_process(logged):
    fmt, server, t = logged
    if fmt != "json":
        pytest.skip("the text server")
    log = server.log_path.read_text()
    assert not_json(log) == []
    entries = [json.loads(line) for line in log.splitlines()]
    loggers = {e["logger"] for e in entries}
    # The launcher, Granian, the engine process and a worker all wrote lines here.
    assert {"rill", "_granian", "rill.engine", "rill.access"} <= loggers, loggers
    assert len({e["pid"] for e in entries}) >= 3
    assert all({"time", "level", "logger", "message", "pid"} <= e.keys() for e in entries)
