"""--kv-cache-disk end to end: a real `rill serve` stopped (SIGTERM) and started again on the same folder serves
the same prompt from its prefix cache on the first request, with the same greedy text."""
from __future__ import annotations

import random

import httpx
import pytest

from rill.cli import main as rill_main
from tests.helpers.server import TINY_MODEL, start_server, stop_server

BLOCK_SIZE = 16  # rill serve's default --block-size
PROMPT_LEN = 200


def complete(srv, prompt: list[int]) -> tuple[int, str]:
    """(cached tokens, greedy text) of one completion."""
    r = httpx.post(f"{srv.base_url}/v1/completions", timeout=60,
                   json={"model": TINY_MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    return body["usage"]["prompt_tokens_details"]["cached_tokens"], body["choices"][0]["text"]


def test_a_restart_serves_a_repeated_prompt_from_the_disk_tier(tmp_path_factory) -> None:
    from rill.bench.serving.tiny_model import write_tiny_model

    tiny = str(write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama"))
    disk = tmp_path_factory.mktemp("kv-disk")
    flags = ("--model", tiny, "--load-format", "dummy", "--served-model-name", TINY_MODEL, "--max-model-len", "512",
             "--dtype", "float32", "--kv-cache-disk", str(disk), "--kv-cache-disk-size", "64MiB",
             "--log-level", "info")
    prompt = [random.randrange(1000, 40000) for _ in range(PROMPT_LEN)]
    num_full = (PROMPT_LEN - 1) // BLOCK_SIZE * BLOCK_SIZE  # the last prompt token's block is always computed

    srv = start_server(tmp_path_factory, *flags)
    try:
        assert complete(srv, prompt)[0] == 0
        warm_cached, warm_text = complete(srv, prompt)  # on top of the cached blocks, as after the restart
        assert warm_cached == num_full
    finally:
        stop_server(srv)
    assert "cached at stop" in srv.log()
    assert list(disk.glob("*/*.kvb")), "nothing was written to the disk tier"

    srv = start_server(tmp_path_factory, *flags)
    try:
        cached, text = complete(srv, prompt)
    finally:
        stop_server(srv)
    assert "blocks reloaded into the prefix cache" in srv.log()
    assert cached == num_full  # the first request after the restart: a prefix-cache hit
    assert text == warm_text


@pytest.mark.parametrize("argv,needle", [
    (["--kv-cache-disk", "DIR", "--model-impl", "transformers"], "--kv-cache-disk needs the native runner"),
    (["--kv-cache-disk", "DIR", "--no-enable-prefix-caching"], "--kv-cache-disk needs prefix caching"),
    (["--kv-cache-disk", "DIR", "--tensor-parallel-size", "2"], "--kv-cache-disk is not served with --tensor-parallel"),
    (["--kv-cache-disk", "DIR", "--kv-cache-disk-size", "lots"], "not a size"),
    (["--kv-cache-disk-size", "1GiB"], "--kv-cache-disk-size needs --kv-cache-disk"),
])
def test_the_flags_are_refused_where_they_cannot_work(argv, needle, tmp_path, capsys) -> None:
    """`rill serve`'s own checks, in process (each a subprocess cost seconds of imports)."""
    with pytest.raises(SystemExit) as exc:
        rill_main(["serve", *(str(tmp_path) if a == "DIR" else a for a in argv)])
    assert exc.value.code == 2
    assert needle in capsys.readouterr().err
