"""`rill serve --kv-cache-dtype int8`: it answers through the OpenAI SDK, /stats shows the int8 cache holding
about twice the blocks of the model's dtype in the same --kv-cache-memory, and bad combinations exit 2."""
from __future__ import annotations

import subprocess

import pytest
import torch

from rill.bench.serving.servers import RILL
from rill.cli import main
from rill.engine_proc.attention.kv_layout import num_blocks_for_memory
from rill.engine_proc.model.loader import load_config
from tests.helpers.server import sdk_client, start_server, stats, stop_server

MEMORY = 64 * 2**20


@pytest.fixture(scope="module")
def int8_server(model_dir, tmp_path_factory):
    srv = start_server(tmp_path_factory, "--kv-cache-dtype", "int8", "--kv-cache-memory", str(MEMORY),
                       "--max-model-len", "1024")
    yield srv
    stop_server(srv)


def test_int8_cache_serves_a_chat_and_holds_about_twice_the_blocks(int8_server, model_dir):
    client = sdk_client(int8_server)
    reply = client.chat.completions.create(
        model=client.models.list().data[0].id, temperature=0, max_tokens=24,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one word."}])
    assert "paris" in reply.choices[0].message.content.lower()
    assert reply.usage.completion_tokens > 0
    figures = stats(int8_server)
    assert figures["kv_cache_dtype"] == "int8"
    default = num_blocks_for_memory(load_config(model_dir), getattr(torch, figures["dtype"]), 16, MEMORY)
    assert 1.85 * default < figures["num_total_blocks"] < 2.0 * default * (4 if figures["dtype"] == "float32" else 1)
    assert figures["kv_cache_bytes"] <= MEMORY
    assert figures["kv_cache_bytes"] > 0.95 * MEMORY  # the memory is spent on blocks, scales included


@pytest.mark.parametrize("flags, words", [
    (["--attention-backend", "torch"], "--attention-backend cpu"),
    (["--device", "cuda"], "--device cuda"),
    (["--model-impl", "transformers"], "--model-impl transformers"),
    (["--dtype", "float16"], "--dtype bfloat16 or float32"),
])
def test_bad_combinations_exit_2_naming_the_flag(flags, words, capsys):
    """Through rill.cli.main in process (a subprocess per case would cost its imports): argparse's exit 2."""
    with pytest.raises(SystemExit) as done:
        main(["serve", "--kv-cache-dtype", "int8", *flags])
    stderr = capsys.readouterr().err
    assert done.value.code == 2 and "--kv-cache-dtype int8" in stderr and words in stderr, stderr


def test_the_cli_exits_2_for_a_bad_combination():
    done = subprocess.run([str(RILL), "serve", "--kv-cache-dtype", "int8", "--attention-backend", "torch"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--kv-cache-dtype int8" in done.stderr, done.stderr
