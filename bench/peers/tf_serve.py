"""`transformers serve --continuous-batching` as a peer of bench/peers: a child process driven by our harness.

transformers serve reads only the request fields it knows and rejects others (so no ignore_eos or
min_tokens). A per-request `generation_config` without an eos token makes every request run to
its max_tokens, as ignore_eos does for Rill; greedy as Rill's side. Its streams end without
`data: [DONE]`, so the harness is told not to require it. It lists no model unless the model is in
the Hugging Face hub cache, so the model id is the directory it serves, given with every request.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from rill.bench.serving.serve import BenchConfig, run_benchmark
from rill.bench.serving.servers import ServerProcess, free_port

TRANSFORMERS = Path(sys.executable).with_name("transformers")
EXTRA_BODY = {"generation_config": json.dumps({"do_sample": False})}


def transformers_serve(model_dir: Path, scratch: Path, num_threads: int) -> ServerProcess:
    """The server on a free port, float32 on the CPU, offline, with its hub cache in `scratch`."""
    port = free_port()
    argv = [str(TRANSFORMERS), "serve", "--continuous-batching", "--device", "cpu", "--dtype", "float32",
            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", str(model_dir)]
    hub = scratch / "hf-hub"
    hub.mkdir(exist_ok=True)
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "OMP_NUM_THREADS": str(num_threads)}
    return ServerProcess(argv, port, scratch / "transformers-serve.log", ready_path="/health", env=env)


def run_forced(base_url: str, prompts: list, concurrency: int, name: str, **overrides) -> dict:
    """The prompts through our harness, greedy; every request must complete with its full length."""
    settings = dict(max_concurrency=concurrency, num_warmups=0, ignore_eos=True, temperature=0.0,
                    disable_tqdm=True, num_prompts=len(prompts))
    cfg = BenchConfig(base_url=base_url, **{**settings, **overrides})
    result = asyncio.run(run_benchmark(cfg, prompts))
    if result["completed"] != len(prompts):
        raise RuntimeError(f"{name}: {result['failed']} of {len(prompts)} requests failed: {result['errors']}")
    expected = sum(p.expected_output_len for p in prompts)
    if result["total_output_tokens"] != expected:
        raise RuntimeError(f"{name} sent {result['total_output_tokens']} output tokens, expected {expected}")
    return result


def serve_throughput(base_url: str, model_id: str, prompts: list) -> dict:
    """Every prompt at once (concurrency = len(prompts)); aggregate output tokens/s."""
    result = run_forced(base_url, prompts, len(prompts), "transformers serve", model=model_id,
                        ignore_eos=False, require_done=False, extra_body=EXTRA_BODY)
    return {"output_throughput": result["output_throughput"], "duration_s": result["duration"],
            "num_output_tokens": result["total_output_tokens"]}
