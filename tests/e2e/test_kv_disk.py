"""--kv-cache-disk end to end: a real `rill serve` stopped (SIGTERM) and started again on the same folder serves
the same prompt from its prefix cache on the first request, with the same greedy text."""
from __future__ import annotations

import random
import subprocess
import sys

import httpx

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


def test_the_flags_are_refused_where_they_cannot_work(tmp_path) -> None:
    for extra, needle in ((["--model-impl", "transformers"], "--kv-cache-disk needs the native runner"),
                          (["--no-enable-prefix-caching"], "--kv-cache-disk needs prefix caching"),
                          (["--tensor-parallel-size", "2"], "--kv-cache-disk is not served with --tensor-parallel"),
                          (["--kv-cache-disk-size", "lots"], "not a size")):
        run = subprocess.run([sys.executable, "-m", "rill.cli", "serve", "--kv-cache-disk", str(tmp_path), *extra],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and needle in run.stderr, run.stderr
    run = subprocess.run([sys.executable, "-m", "rill.cli", "serve", "--kv-cache-disk-size", "1GiB"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--kv-cache-disk-size needs --kv-cache-disk" in run.stderr
