"""`python -m rill.bench.features.kv_disk`: TTFT of a repeated long prompt after a restart, with --kv-cache-disk.

A server with --kv-cache-disk gets each of a few long prompts (1,500 random token ids by default) once (cold:
nothing cached), then once more (warm: the prefix cache's hit); it is stopped (SIGTERM, a clean stop) and
started again with the same flags, and each prompt is sent a third time (after the restart: served from the
blocks reloaded from disk before the server said it was ready). Each time is to the first streamed token;
the figure is after-restart / warm (1.0x: the restart lost nothing) beside after-restart / cold.
"""
from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from rill.bench.features.prefix_cache import ttft_ms
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server


def started(flags: tuple[str, ...], log_path: Path):
    """A ready server, and how long it took to be ready."""
    began = time.perf_counter()
    srv = rill_server(*flags, log_path=log_path).wait_ready()
    return srv, time.perf_counter() - began


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.features.kv_disk", description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=1500)
    ap.add_argument("--quick", action="store_true", help="1 prompt of 200 tokens: checks that it runs")
    ap.add_argument("--out", type=Path, default=Path("bench/results/kv_disk-cpu.json"))
    args = ap.parse_args(argv)
    num_prompts, prompt_len = (1, 200) if args.quick else (args.prompts, args.prompt_len)
    rng = random.Random(1234)
    prompts = [[rng.randrange(100, 49152) for _ in range(prompt_len)] for _ in range(num_prompts)]
    rows = [{"prompt": i} for i in range(num_prompts)]
    with tempfile.TemporaryDirectory(prefix="rill-bench-") as scratch:
        # Eager: the prompt steps that TTFT measures run eagerly anyway, and each start skips ~30 s of compiling.
        flags = ("--max-model-len", "2048", "--enforce-eager", "--kv-cache-disk", str(Path(scratch) / "kv"),
                 "--log-level", "info")
        srv, first_start_s = started(flags, Path(scratch) / "before.log")
        with srv:
            model = httpx.get(f"{srv.base_url}/v1/models").json()["data"][0]["id"]
            ttft_ms(srv.base_url, model, [rng.randrange(100, 49152) for _ in range(64)])  # warm-up
            for row, prompt in zip(rows, prompts):
                row["cold_ttft_ms"], row["cold_cached"] = ttft_ms(srv.base_url, model, prompt)
                row["warm_ttft_ms"], row["warm_cached"] = ttft_ms(srv.base_url, model, prompt)
        stop_log = (Path(scratch) / "before.log").read_text()
        srv, restart_s = started(flags, Path(scratch) / "after.log")
        with srv:
            ttft_ms(srv.base_url, model, [rng.randrange(100, 49152) for _ in range(64)])  # the same warm-up
            for row, prompt in zip(rows, prompts):
                row["restart_ttft_ms"], row["restart_cached"] = ttft_ms(srv.base_url, model, prompt)
        start_log = (Path(scratch) / "after.log").read_text()
    for row in rows:
        row["restart_over_warm"] = row["restart_ttft_ms"] / row["warm_ttft_ms"]
        row["restart_over_cold"] = row["restart_ttft_ms"] / row["cold_ttft_ms"]
    over_warm = statistics.median(r["restart_over_warm"] for r in rows)
    over_cold = statistics.median(r["restart_over_cold"] for r in rows)
    spilled = re.search(r"--kv-cache-disk: .*", stop_log)
    reloaded = re.search(r"--kv-cache-disk \S+: .*", start_log)
    report = {"benchmark": "kv_disk", **provenance("rill.bench.features.kv_disk", argv, None),
              "params": {"prompts": num_prompts, "prompt_len": prompt_len}, "rows": rows,
              "median_restart_over_warm": over_warm, "median_restart_over_cold": over_cold,
              "first_start_s": first_start_s, "restart_s": restart_s,
              "stop_log": spilled.group(0) if spilled else "", "start_log": reloaded.group(0) if reloaded else ""}
    lines = [f"# --kv-cache-disk: TTFT of a repeated {prompt_len}-token prompt after a restart", "",
             f"`{report['command']}` on {report['date']}, {report['machine']['cpu_count']} CPUs "
             f"({report['machine'].get('cpu_model', '')}), the bundled model, --enforce-eager.", "",
             table(["prompt", "cold TTFT ms", "warm TTFT ms", "after restart TTFT ms", "after / warm", "after / cold",
                    "cached tokens (cold, warm, after)"],
                   [[r["prompt"], f"{r['cold_ttft_ms']:.0f}", f"{r['warm_ttft_ms']:.0f}", f"{r['restart_ttft_ms']:.0f}",
                     f"{r['restart_over_warm']:.2f}x", f"{r['restart_over_cold']:.2f}x",
                     f"{r['cold_cached']}, {r['warm_cached']}, {r['restart_cached']}"] for r in rows]), "",
             f"Median after-restart TTFT: **{over_warm:.2f}x** the warm repeat's before it, "
             f"**{over_cold:.2f}x** the cold request's.", "",
             f"Start to ready: {first_start_s:.1f} s (empty folder), {restart_s:.1f} s (the restart, reloading).", "",
             f"Stop: `{report['stop_log']}`", "", f"Start: `{report['start_log']}`", ""]
    save_results(args.out, report, "\n".join(lines))
    print("\n".join(lines))
    return report


if __name__ == "__main__":
    main()
