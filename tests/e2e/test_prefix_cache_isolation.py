"""Per-key prefix-cache isolation end to end: two real servers with two API keys each, one under the default
(`--prefix-cache-isolation key`), one under `none`; hits seen through usage's cached tokens, as a tenant sees them.
And emptying the cache over HTTP (--enable-cache-reset, on the second server): keyed, and off by default."""
from __future__ import annotations

import random

import httpx
import pytest

from tests.helpers.server import TINY_MODEL, start_servers, stop_server

KEY_A, KEY_B = "sk-tenant-a-5b1c", "sk-tenant-b-90de"
BLOCK_SIZE = 16  # rill serve's default --block-size
PROMPT_LEN = 40  # two full blocks are cached: (40 - 1) // 16 * 16
NUM_CACHED = 32


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama"))
    common = ("--model", tiny, "--load-format", "dummy", "--served-model-name", TINY_MODEL, "--max-model-len", "256",
              "--api-key", KEY_A, "--api-key", KEY_B, "--log-level", "info")  # info: the isolation's start line
    isolated, shared = start_servers(tmp_path_factory, common,
                                     (*common, "--prefix-cache-isolation", "none", "--enable-cache-reset"))
    yield isolated, shared
    for srv in (isolated, shared):
        stop_server(srv)
    logs = [srv.log_path.read_text() for srv in (isolated, shared)]
    assert "prefix cache isolation: key" in logs[0] and "prefix cache isolation: none" in logs[1]
    assert not any(key in log for key in (KEY_A, KEY_B) for log in logs), "an API key reached the log"


@pytest.fixture(scope="module")
def isolated(servers):
    return servers[0]


@pytest.fixture(scope="module")
def shared(servers):
    return servers[1]


def fresh_prompt() -> list[int]:
    """Token ids no other request of the session sent."""
    return [random.randrange(1000, 40000) for _ in range(PROMPT_LEN)]


def complete(srv, key: str, prompt, **extra) -> int:
    """The cached tokens of one completion sent with `key`."""
    r = httpx.post(f"{srv.base_url}/v1/completions", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                   json={"model": TINY_MODEL, "prompt": prompt, "max_tokens": 1, **extra})
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_a_key_hits_its_own_cache_and_never_anothers(isolated):
    prompt = fresh_prompt()
    assert complete(isolated, KEY_A, prompt) == 0
    assert complete(isolated, KEY_A, prompt) == NUM_CACHED
    assert complete(isolated, KEY_B, prompt) == 0  # A's blocks are cached, and B cannot tell
    assert complete(isolated, KEY_B, prompt) == NUM_CACHED  # its own copy now


def test_a_copied_cache_salt_does_not_join_another_keys_cache(isolated):
    prompt = fresh_prompt()
    assert complete(isolated, KEY_A, prompt, cache_salt="team-x") == 0
    assert complete(isolated, KEY_A, prompt, cache_salt="team-x") == NUM_CACHED
    assert complete(isolated, KEY_B, prompt, cache_salt="team-x") == 0  # B copied A's salt: still apart
    assert complete(isolated, KEY_A, prompt) == 0  # the salt splits A's own cache further
    assert complete(isolated, KEY_A, prompt, cache_salt="team-y") == 0


def test_isolation_none_shares_across_keys_and_cache_salt_still_separates(shared):
    prompt = fresh_prompt()
    assert complete(shared, KEY_A, prompt) == 0
    assert complete(shared, KEY_B, prompt) == NUM_CACHED  # one cache for every key
    assert complete(shared, KEY_B, prompt, cache_salt="s1") == 0  # vLLM's cache_salt
    assert complete(shared, KEY_A, prompt, cache_salt="s1") == NUM_CACHED  # under none, a salt is shared
    assert complete(shared, KEY_A, prompt, cache_salt="s2") == 0


LONG_TEXT = " ".join(f"Harbour {i} has a {c} lamp." for i, c in enumerate(["red", "green", "white"] * 6))


def cached_via(srv, key: str, route: str, salt: str | None = None) -> int:
    """The cached input tokens a chat-shaped route reports: chat's, the Responses API's, or Anthropic's."""
    extra = {} if salt is None else {"cache_salt": salt}
    headers = {"Authorization": f"Bearer {key}"}
    if route == "chat":
        body = {"model": TINY_MODEL, "messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 1, **extra}
        r = httpx.post(f"{srv.base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    if route == "responses":
        body = {"model": TINY_MODEL, "input": LONG_TEXT, "max_output_tokens": 1, "store": False, **extra}
        r = httpx.post(f"{srv.base_url}/v1/responses", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens_details"]["cached_tokens"]
    body = {"model": TINY_MODEL, "messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 1, **extra}
    r = httpx.post(f"{srv.base_url}/v1/messages", json=body, headers={"x-api-key": key}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["cache_read_input_tokens"]


@pytest.mark.parametrize("route", ["chat", "responses", "messages"])
def test_chat_shaped_routes_show_a_tenant_its_own_hits_only(isolated, route):
    salt = f"{route}-{random.random()}"  # a namespace of this test's own within each key
    assert cached_via(isolated, KEY_A, route, salt) == 0
    assert cached_via(isolated, KEY_A, route, salt) > 0
    assert cached_via(isolated, KEY_B, route, salt) == 0


BAD_SALTS = [123, "", "x" * 257, ["a"]]  # wrong type, empty, too long (256 at most)
ROUTES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 1}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}),
    ("/infill", {"input_prefix": "def f():", "n_predict": 1}),
]


@pytest.mark.parametrize(("path", "body"), ROUTES, ids=[p for p, _ in ROUTES])
def test_a_bad_cache_salt_is_a_400_naming_it(isolated, path, body):
    for salt in BAD_SALTS:
        r = httpx.post(f"{isolated.base_url}{path}", json={"model": TINY_MODEL, **body, "cache_salt": salt},
                       headers={"Authorization": f"Bearer {KEY_A}"}, timeout=30)
        assert r.status_code == 400, (salt, r.text)
        error = r.json()["error"]
        assert error.get("param") == "cache_salt" or "cache_salt" in error["message"], r.text


def test_the_cache_reset_routes_empty_the_cache_behind_the_key(isolated, shared):
    """vLLM's POST /reset_prefix_cache and SGLang's /flush_cache, under --enable-cache-reset only."""
    prompt = fresh_prompt()
    assert complete(shared, KEY_A, prompt) == 0
    assert complete(shared, KEY_B, prompt) == NUM_CACHED
    headers = {"Authorization": f"Bearer {KEY_A}"}
    assert httpx.post(f"{shared.base_url}/reset_prefix_cache", timeout=30).status_code == 401  # no key
    assert complete(shared, KEY_A, prompt) == NUM_CACHED  # nothing was reset
    r = httpx.post(f"{shared.base_url}/reset_prefix_cache", headers=headers, timeout=30)
    assert r.status_code == 200 and r.content == b""
    assert httpx.get(f"{shared.base_url}/stats", headers=headers, timeout=30).json()["num_cached_blocks"] == 0
    assert complete(shared, KEY_B, prompt) == 0  # computed again
    assert complete(shared, KEY_A, prompt) == NUM_CACHED  # and cached again
    for method in ("GET", "POST"):
        r = httpx.request(method, f"{shared.base_url}/flush_cache", headers=headers, timeout=30)
        assert r.status_code == 200 and r.text.startswith("Cache flushed"), r.text
        assert complete(shared, KEY_A, prompt) == 0
    off = httpx.post(f"{isolated.base_url}/reset_prefix_cache", headers=headers, timeout=30)
    assert off.status_code == 404 and "--enable-cache-reset" in off.json()["error"]["message"]
