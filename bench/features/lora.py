"""`python -m rill.bench.features.lora`: what LoRA adapters cost. A `rill serve --enable-lora` with three PEFT adapters of
the bundled model (rank 16, every linear of every layer), otherwise with its defaults, against itself
and against a plain `rill serve`:

1. Throughput at concurrency 32, 64 requests of 128 random tokens in and 64 forced tokens out: every
   request for the base model, then a mixed batch (a quarter each for the three adapters and the base).
2. Time per output token at concurrency 1 (128 forced tokens): the base model, then one adapter.

A step with an adapter in it runs eagerly (the compiled decode graph holds the base linears): the
mixed batch pays that and the adapters' own matmuls.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from rill.bench.features.lora_adapters import make_adapter
from rill.bench.features.speculative import MODEL, latency, random_bodies, run
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

NAMES = ("a", "b", "c")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_models(bodies: list[dict], models: list[str]) -> list[dict]:
    return [{**body, "model": models[i % len(models)]} for i, body in enumerate(bodies)]


def throughput(url: str, bodies: list[dict], concurrency: int) -> float:
    started = time.perf_counter()
    results = asyncio.run(run(url, bodies, concurrency))
    return sum(r["tokens"] for r in results) / (time.perf_counter() - started)


def measure(flags: list[str], log: Path, quick: bool, lora: bool) -> dict:
    num, conc = (8, 8) if quick else (64, 32)
    with rill_server(*flags, log_path=log).wait_ready(900) as srv:
        url = srv.base_url
        asyncio.run(run(url, with_models(random_bodies(8, 128, 16, seed=9), [MODEL, *NAMES] if lora else [MODEL]), 8))
        bodies = random_bodies(num, 128, 64, seed=0)
        single = random_bodies(1 if quick else 3, 16, 128, seed=3)
        out = {"base_tok_s": throughput(url, with_models(bodies, [MODEL]), conc),
               "base_c1": latency(asyncio.run(run(url, with_models(single, [MODEL]), 1)))}
        if lora:
            out["mixed_tok_s"] = throughput(url, with_models(bodies, [*NAMES, MODEL]), conc)
            out["adapter_c1"] = latency(asyncio.run(run(url, with_models(single, ["a"]), 1)))
        out["stats"] = httpx.get(f"{url}/stats", timeout=30).json()
    return out


def report_markdown(report: dict) -> str:
    plain, lora = report["plain"], report["lora"]
    rows = [
        ["output tok/s, concurrency 32, every request for the base model", f"{plain['base_tok_s']:.0f}",
         f"{lora['base_tok_s']:.0f}", f"{lora['base_tok_s'] / plain['base_tok_s']:.2f}x", ""],
        ["the same, a mixed batch (3 adapters + base, a quarter each)", "", f"{lora['mixed_tok_s']:.0f}", "",
         f"{lora['mixed_tok_s'] / lora['base_tok_s']:.2f}x"],
        ["time per output token, concurrency 1, the base model", f"{plain['base_c1']['tpot_ms']:.2f} ms",
         f"{lora['base_c1']['tpot_ms']:.2f} ms", f"{lora['base_c1']['tpot_ms'] / plain['base_c1']['tpot_ms']:.2f}x", ""],
        ["the same, one adapter", "", f"{lora['adapter_c1']['tpot_ms']:.2f} ms", "",
         f"{lora['adapter_c1']['tpot_ms'] / lora['base_c1']['tpot_ms']:.2f}x"],
    ]
    machine = report["machine"]
    return (f"# LoRA adapters: a mixed batch against a base-only batch\n\n`{report['command']}` on "
            f"{machine.get('cpu_model', '?')} ({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), "
            f"{report['date']}; the bundled model ({plain['stats'].get('dtype', '?')}), three PEFT adapters of rank 16 "
            "on every linear; each server with its defaults otherwise (decode steps compiled).\n\n"
            + table(["figure", "plain server", "--enable-lora server", "LoRA server / plain", "vs base-only"], rows)
            + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true", help="a few requests, eager servers: checks the bench runs")
    args = ap.parse_args(argv)
    from rill.engine_proc.model.bundled import ensure_bundled_model

    model_dir = ensure_bundled_model()
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-lora-"))
    modules = [f"{name}={make_adapter(model_dir, tmp / name, 16, 32, TARGETS, seed)[0]}"
               for seed, name in enumerate(NAMES)]
    eager = ["--enforce-eager"] if args.quick else []
    plain = measure(eager, tmp / "plain.log", args.quick, lora=False)
    lora = measure([*eager, "--enable-lora", "--max-loras", "3", "--lora-modules", *modules], tmp / "lora.log",
                   args.quick, lora=True)
    report = {**provenance("rill.bench.features.lora", argv, args.machine), "plain": plain, "lora": lora}
    md = report_markdown(report)
    if not args.quick:
        save_results(args.out / f"lora-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
