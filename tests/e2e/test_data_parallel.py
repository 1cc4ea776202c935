"""End to end: --data-parallel-size 2 (two engines, each with its own KV cache, behind the same API
workers): prefix affinity, load spreading, the same answers from either engine, per-engine /stats
and /metrics, and an engine's death, or its failure at start, taking the server down cleanly."""
from __future__ import annotations

import concurrent.futures
import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.server import TINY_MODEL, launch_server, leftovers, session_pids, start_server, stop_server

SHARED = list(range(100, 100 + 5 * 16))  # five full blocks


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from rill.bench.serving.tiny_model import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


def dp_server(tmp_path_factory, tiny_dir, *flags: str):
    return start_server(tmp_path_factory, "--model", str(tiny_dir), "--load-format", "dummy", "--served-model-name",
                        TINY_MODEL, "--data-parallel-size", "2", "--max-model-len", "512", *flags)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    """Two hand-written LoRA adapters of the tiny model: name -> directory."""
    from tests.helpers.tiny_lora import write_adapter

    root = tmp_path_factory.mktemp("adapters")
    return {name: str(write_adapter(root / name, seed=seed)) for seed, name in enumerate(("hand", "later"))}


@pytest.fixture(scope="module")
def dp(tmp_path_factory, tiny_dir, adapters):
    srv = dp_server(tmp_path_factory, tiny_dir, "--workers", "2", "--enable-lora", "--lora-modules",
                    f"hand={adapters['hand']}", "--allow-runtime-lora-updating", "--max-loras", "2")
    yield srv
    stop_server(srv)


def complete(server, prompt, max_tokens: int = 4, **extra) -> dict:
    r = httpx.post(f"{server.base_url}/v1/completions", json={"model": TINY_MODEL, "prompt": prompt,
                                                              "max_tokens": max_tokens, "temperature": 0, **extra},
                   timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def engines(server) -> list[dict]:
    stats = httpx.get(f"{server.base_url}/stats", timeout=30).json()
    assert len(stats["engines"]) == 2
    for key in ("num_finished", "num_prefix_hit_tokens", "num_total_blocks"):
        assert stats[key] == sum(e[key] for e in stats["engines"]), key
    return stats["engines"]


def test_requests_sharing_a_prefix_go_to_the_engine_that_holds_it(dp):
    before = [e["num_finished"] for e in engines(dp)]
    with httpx.Client() as one_connection:  # one worker: the one whose memory of prefixes is tested
        for i in range(6):
            r = one_connection.post(f"{dp.base_url}/v1/completions", timeout=120, json={
                "model": TINY_MODEL, "prompt": SHARED + [500 + i, 501 + i], "max_tokens": 2})
            assert r.status_code == 200
    after = engines(dp)
    served = [e["num_finished"] - b for e, b in zip(after, before)]
    assert sorted(served) == [0, 6], served
    assert after[served.index(6)]["num_prefix_hit_tokens"] >= 5 * 5 * 16  # the 5 after the first hit


def test_concurrent_requests_spread_over_both_engines_and_answer_alike(dp):
    """Prompts shorter than a block carry no prefix: the least-loaded engine takes each; the same weights and
    greedy answer alike whichever engine answered."""
    assert len(answers_from_both_engines(dp, TINY_MODEL, max_tokens=48)) == 1


def test_metrics_label_each_engine(dp):
    text = httpx.get(f"{dp.base_url}/metrics", timeout=30).text
    running = [s for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "rill:num_requests_running"]
    assert sorted(s.labels["engine"] for s in running) == ["0", "1"]


def test_an_engines_death_stops_the_server_with_a_failure(tmp_path_factory, tiny_dir):
    srv = dp_server(tmp_path_factory, tiny_dir)
    pids = [e["pid"] for e in engines(srv)]
    os.kill(pids[1], signal.SIGKILL)
    code = srv.proc.wait(60)
    assert code == 1, srv.log()
    assert "died" in srv.log()
    time.sleep(0.5)
    for pid in pids:  # rank 0 was stopped, not orphaned
        assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    assert leftovers(srv.proc.pid) == []


def test_a_family_on_the_transformers_route_serves_from_both_engines(tmp_path_factory):
    """A Gemma 3 (no native implementation: transformers' model over the paged cache) behind two
    engines: each runs the route, both serve, and they answer alike (the same dummy weights)."""
    from rill.bench.families import family_configs, write_model_dir

    model_dir = write_model_dir(family_configs()["gemma3_text"], tmp_path_factory.mktemp("gemma3") / "g")
    srv = start_server(tmp_path_factory, "--model", str(model_dir), "--load-format", "dummy", "--served-model-name",
                       TINY_MODEL, "--data-parallel-size", "2", "--max-model-len", "512", "--log-level", "info")
    try:
        with httpx.Client() as one_connection, concurrent.futures.ThreadPoolExecutor(4) as pool:
            def run(_):
                r = one_connection.post(f"{srv.base_url}/v1/completions", timeout=120, json={
                    "model": TINY_MODEL, "prompt": [7, 8, 9], "max_tokens": 24, "temperature": 0, "ignore_eos": True})
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            texts = list(pool.map(run, range(4)))
        served = [e["num_finished"] for e in engines(srv)]
        log = srv.log()
    finally:
        stop_server(srv)
    assert min(served) >= 1 and sum(served) == 4, served
    assert len(set(texts)) == 1
    assert log.count("transformers runner on cpu") == 2


def outliving(session_id: int, seconds: float = 5.0) -> list[int]:
    """The server's processes still alive after `seconds` at most. The engines are killed and reaped before the
    launcher exits, but what they and the launcher started (multiprocessing's resource tracker, a compile worker)
    leaves on its own once its parent is gone: it may still be there for a moment (seen once in a clean clone)."""
    deadline = time.monotonic() + seconds
    while (pids := session_pids(session_id)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids


def test_engines_that_fail_at_start_stop_the_server_with_a_failure(tmp_path_factory, tiny_dir):
    """The engines start at once; one that fails (here both: a KV cache too small for one block) stops the
    launcher with status 1 and the reason, and the other, whether still starting or failed too, goes with it."""
    srv = launch_server(tmp_path_factory, "--model", str(tiny_dir), "--load-format", "dummy", "--data-parallel-size",
                        "2", "--kv-cache-memory", "1KiB")
    assert srv.proc.wait(120) == 1, srv.log()
    assert "holds no KV block" in srv.log() and "the engine failed to start" in srv.log()
    assert outliving(srv.proc.pid) == []  # no engine outlived it
    assert leftovers(srv.proc.pid) == []


def answers_from_both_engines(server, model: str, max_tokens: int = 24) -> set[str]:
    """The texts of four concurrent greedy requests for `model`, which both engines served (checked)."""
    before = [e["num_finished"] for e in engines(server)]
    with httpx.Client() as one_connection, concurrent.futures.ThreadPoolExecutor(4) as pool:
        def run(_):
            r = one_connection.post(f"{server.base_url}/v1/completions", timeout=120, json={
                "model": model, "prompt": [7, 8, 9], "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        texts = set(pool.map(run, range(4)))
    served = [e["num_finished"] - b for e, b in zip(engines(server), before)]
    assert min(served) >= 1 and sum(served) == 4, served
    return texts


def test_lora_adapters_are_served_by_every_engine_and_loaded_into_each(dp, adapters):
    """An adapter of --lora-modules, and one loaded at runtime, answer alike from either engine (and unlike the
    base model); unloaded, it is gone from both."""
    (base,) = answers_from_both_engines(dp, TINY_MODEL)
    (hand,) = answers_from_both_engines(dp, "hand")
    r = httpx.post(f"{dp.base_url}/v1/load_lora_adapter", json={"lora_name": "later", "lora_path": adapters["later"]},
                   timeout=60)
    assert r.status_code == 200, r.text
    (later,) = answers_from_both_engines(dp, "later")
    assert len({base, hand, later}) == 3
    r = httpx.post(f"{dp.base_url}/v1/unload_lora_adapter", json={"lora_name": "later"}, timeout=60)
    assert r.status_code == 200, r.text
    again = httpx.post(f"{dp.base_url}/v1/unload_lora_adapter", json={"lora_name": "later"}, timeout=60)
    assert again.status_code == 404, again.text  # neither engine holds it
