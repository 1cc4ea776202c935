"""`python -m rill.bench.kernels.kv_cache_int8`: what `--kv-cache-dtype int8` costs in quality and buys in memory and speed.

The bundled model through Rill's ModelRunner on the "cpu" attention backend, in bfloat16, with its KV cache in
bfloat16 (auto) and in int8 (engine_proc/attention/kv_int8.py), and in float32 as a yardstick of how far a change
of rounding alone moves this model:
- perplexity on bench/data/opticks.txt as quant_quality.py's `decode` figure measures it (windows of `--window`
  tokens, the last `--stride` scored one decode step at a time, 8 windows a step), so every scored token's
  attention reads its context from the cache: int8 rows, for the int8 runner;
- greedy agreement with the bfloat16-cache runner over `--num-prompts` prompts x `--new-tokens` tokens (quant_quality's
  prompts): the share of prompts identical, and the mean share of tokens before the first divergence;
- memory: KV blocks of 16 tokens per GiB (num_blocks_for_memory, what `rill serve` allocates);
- speed, interleaved over rounds (medians): a decode step at batch 1 and 32 with every row's context `--context`
  tokens, and a 512-token prefill (a fresh prompt: its attention reads its own new K/V, the cache is only written).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from rill.bench.kernels.quant_quality import (
    BATCH,
    BLOCK_SIZE,
    EOS_ID,
    TEXT_PATH,
    agreement,
    blocks_per_seq,
    greedy,
    load_prompts,
    new_request,
    nll_decode,
)
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.attention.kv_layout import num_blocks_for_memory
from rill.engine_proc.model.bundled import ensure_bundled_model
from rill.engine_proc.model.loader import load_config
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.ipc.config import ModelConfig

SIDES = {"bfloat16, bf16 KV": ("bfloat16", "auto"), "bfloat16, int8 KV": ("bfloat16", "int8"),
         "float32, fp32 KV": ("float32", "auto")}
REFERENCE = "bfloat16, bf16 KV"
FULL = {"ppl_tokens": 2304, "window": 512, "stride": 256, "num_prompts": 64, "new_tokens": 32, "rounds": 5,
        "context": 1024, "prefill_tokens": 512, "timed_steps": 8, "batch_sizes": [1, 32]}
QUICK = {"ppl_tokens": 96, "window": 64, "stride": 32, "num_prompts": 8, "new_tokens": 4, "rounds": 1,
         "context": 64, "prefill_tokens": 32, "timed_steps": 2, "batch_sizes": [1, 4]}


def make(model_dir: Path, dtype: str, kv: str, num_blocks: int) -> ModelRunner:
    config = ModelConfig(model_dir=str(model_dir), block_size=BLOCK_SIZE, attention_backend="cpu", enforce_eager=True,
                         kv_cache_dtype=kv)
    return ModelRunner(config, dtype=getattr(torch, dtype), device="cpu", num_kv_blocks=num_blocks,
                       eos_token_ids=[EOS_ID])


@torch.inference_mode()
def time_steps(runners: dict[str, ModelRunner], sizes: dict) -> dict:
    """Median ms of a prefill of `prefill_tokens` and of decode steps at each batch size over `context` tokens."""
    context, steps = sizes["context"], sizes["timed_steps"]
    keys = ["prefill_ms", *(f"decode_b{b}_ms" for b in sizes["batch_sizes"])]
    samples = {name: {k: [] for k in keys} for name in runners}
    prompt = [EOS_ID + 1 + i % 1000 for i in range(max(context, sizes["prefill_tokens"]))]
    for _ in range(sizes["rounds"]):
        for name, runner in runners.items():
            ids = prompt[:sizes["prefill_tokens"]]
            req = new_request("p", ids, 1, len(ids))
            started = time.perf_counter()
            runner.compute_logits(Batch([ScheduledSeq(req, 0, len(ids))]))
            samples[name]["prefill_ms"].append((time.perf_counter() - started) * 1000)
            for batch_size in sizes["batch_sizes"]:
                # The context is not computed, only held: attention reads the same bytes whatever they are.
                n = blocks_per_seq(context + steps + 1)
                reqs = [new_request(f"t{i}", prompt[:context], 1 + i * n, context + steps + 1) for i in range(batch_size)]
                step_ms = []
                for step in range(steps):
                    for r in reqs:
                        r.num_computed_tokens = r.num_tokens
                        r.output_ids.append(EOS_ID + 1 + step)
                    started = time.perf_counter()
                    runner.compute_logits(Batch([ScheduledSeq(r, r.num_computed_tokens, 1) for r in reqs]))
                    step_ms.append((time.perf_counter() - started) * 1000)
                samples[name][f"decode_b{batch_size}_ms"].append(statistics.median(step_ms))
    return {name: {k: statistics.median(v) for k, v in s.items()} for name, s in samples.items()}


def run(sizes: dict, speed_only: bool = False) -> dict:
    model_dir = ensure_bundled_model()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text_ids = tokenizer.encode(TEXT_PATH.read_text()).ids
    window, stride = sizes["window"], sizes["stride"]
    ppl_ids = text_ids[: sizes["ppl_tokens"]]
    windows = [ppl_ids[s:s + window] for s in range(0, len(ppl_ids) - window + 1, stride)]
    prompts = load_prompts(tokenizer, text_ids, sizes["num_prompts"], sizes["ppl_tokens"])
    longest = max(window, max(map(len, prompts)) + sizes["new_tokens"], sizes["context"] + sizes["timed_steps"] + 1)
    num_blocks = 1 + max(BATCH, max(sizes["batch_sizes"])) * blocks_per_seq(longest)
    config = load_config(model_dir)
    rows, outputs, runners = [], {}, {}
    for name, (dtype, kv) in SIDES.items():
        if speed_only and dtype == "float32":
            continue
        runner = runners[name] = make(model_dir, dtype, kv, num_blocks)
        per_gib = num_blocks_for_memory(config, getattr(torch, dtype), BLOCK_SIZE, 2**30, kv_cache_dtype=kv)
        rows.append({"side": name, "blocks_per_gib": per_gib, "kv_bytes_per_token": round(2**30 / per_gib / BLOCK_SIZE)})
        if not speed_only:
            nll, _ = nll_decode(runner, windows, stride)
            outputs[name] = greedy(runner, prompts, sizes["new_tokens"])
            rows[-1]["ppl_decode"] = math.exp(nll / (len(windows) * stride))
    for row in rows if not speed_only else ():
        row["greedy"] = agreement(outputs[REFERENCE], outputs[row["side"]])
    speed = time_steps({n: r for n, r in runners.items() if n != "float32, fp32 KV"}, sizes)
    for row in rows:
        row.update(speed.get(row["side"], {}))
    return {"rows": rows, "sizes": sizes, "scored_tokens": len(windows) * stride}


def markdown(report: dict) -> str:
    rows = report["rows"]
    ref = next(r for r in rows if r["side"] == REFERENCE)
    keys = [k for k in ref if k.endswith("_ms")]
    quality = "greedy" in ref
    body = [[r["side"], *((f"{r['ppl_decode']:.3f}", f"{r['greedy']['identical']:.0%}",
                           f"{r['greedy']['mean_prefix_share']:.0%}") if quality else ()), str(r["blocks_per_gib"]),
             f"{r['blocks_per_gib'] / ref['blocks_per_gib']:.2f}x",
             *(f"{r[k]:.1f} ({r[k] / ref[k]:.2f}x)" if k in r else "" for k in keys)] for r in rows]
    head = ["KV cache", *(("ppl (decode)", "greedy identical", "tokens before divergence") if quality else ()),
            "blocks/GiB", "vs bf16",
            *(k.removesuffix("_ms").replace("_", " ") + " ms" for k in keys)]
    s = report["sizes"]
    return (f"# --kv-cache-dtype int8 against the bfloat16 cache\n\n`{report['command']}`\n\n"
            f"CPU: {report['machine'].get('cpu_model', '')} ({report['machine'].get('cpu_flags', '')})\n\n"
            + table(head, body) + "\n\n"
            + (f"Perplexity over {report['scored_tokens']} tokens of opticks.txt ({s['window']}-token windows, the last "
            f"{s['stride']} decoded); greedy: {s['num_prompts']} prompts x {s['new_tokens']} tokens against the bf16 cache; "
               if quality else "") + f"Decode steps over {s['context']}-token contexts, prefill {s['prefill_tokens']} tokens; medians of "
            f"{s['rounds']} rounds.\n")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--speed-only", action="store_true", help="memory and speed alone, bfloat16 against int8")
    ap.add_argument("--machine", default=None, help="the name in the result file (default: the host's)")
    ap.add_argument("--out", type=Path, default=None, help="the JSON result (default: bench/results/kv_cache_int8-MACHINE.json)")
    args = ap.parse_args(argv)
    report = {**provenance("rill.bench.kernels.kv_cache_int8", argv, args.machine),
              **run(QUICK if args.quick else FULL, args.speed_only)}
    summary = markdown(report)
    if not args.quick:
        name = f"kv_cache_int8{'-speed' if args.speed_only else ''}-{report['machine']['name']}.json"
        out = args.out or Path(__file__).parents[1] / "results" / name
        save_results(out, report, summary)
    print(summary)
    return report


if __name__ == "__main__":
    main()
