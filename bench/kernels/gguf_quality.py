"""`python -m rill.bench.kernels.gguf_quality`: Rill's perplexity against llama.cpp's on the same GGUF file.

Issue 33 asks that int4's perplexity be within 1% of llama.cpp's on the same GGUF. Both sides score the bundled
model's file (Q4_1, its embedding Q8_0) on bench/data/opticks.txt the way llama.cpp's `llama-perplexity` does:
- the text is tokenized whole, then cut into `--chunks` consecutive chunks of `--ctx` tokens;
- each chunk is one prompt, its first token replaced by BOS where the file's vocabulary adds one;
- the scored tokens are the second half of each chunk but its first: the logits at positions ctx/2 .. ctx-2
  predict tokens ctx/2 + 1 .. ctx-1.
llama.cpp's side is `llama-perplexity -m FILE -f TEXT -c CTX --chunks N -t THREADS` (built by
bench/peers/llama_cpp.py, beside llama-server); its "Final estimate" is parsed. Rill's side runs the file
through its own loader (`--model FILE.gguf`: the weights dequantized, then `--quantization` as served) on the
prompt path, whose activations stay in the model's dtype, and, for int4, on the decode path too (its VNNI GEMV
rounds the activations to int8 per group of 32, as llama.cpp's CPU kernels round them to Q8).
llama-server's /tokenize checks first that both sides read the text as the same tokens.

Rill's int4 keeps a file's Q4_0, Q4_1 and Q4_K blocks as they are (engine_proc/model/gguf_int4.py); the row
"int4, from floats" quantizes the dequantized weights again instead, as before that. `--quantize Q4_K_M` (or any
llama-quantize type) scores a file llama.cpp's own `llama-quantize` writes from the given one first (with
--allow-requantize: the bundled file's 4-bit weights are its starting point).
"""
from __future__ import annotations

import argparse
import math
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import torch
from tokenizers import Tokenizer

from rill.bench.kernels.quant_quality import (
    BATCH,
    BLOCK_SIZE,
    EOS_ID,
    TEXT_PATH,
    blocks_per_seq,
    nll_decode,
    nll_prefill,
    without_source,
)
from rill.bench.peers import llama_cpp
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.model.bundled import bundled_gguf_path, default_cache_dir
from rill.engine_proc.model.gguf_dir import ensure_gguf_model
from rill.engine_proc.model.gguf_reader import read_gguf
from rill.engine_proc.model.runner import ModelRunner
from rill.ipc.config import ModelConfig

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
SIDES = [("bfloat16", "none"), ("bfloat16", "int4"), ("bfloat16", "int4, from floats"), ("float32", "none")]


def chunks_of(ids: list[int], ctx: int, num_chunks: int, bos_id: int | None) -> list[list[int]]:
    """llama-perplexity's chunks: consecutive, `ctx` tokens each, the first one BOS where the vocabulary adds it."""
    if len(ids) < ctx * num_chunks:
        raise ValueError(f"the text has {len(ids)} tokens: fewer than {num_chunks} chunks of {ctx}")
    out = [list(ids[i * ctx:(i + 1) * ctx]) for i in range(num_chunks)]
    if bos_id is not None:
        for chunk in out:
            chunk[0] = bos_id
    return out


def parse_final(output: str) -> tuple[float, float]:
    """(perplexity, its +/-) from llama-perplexity's output."""
    found = FINAL.search(output)
    if found is None:
        raise ValueError(f"no final estimate in llama-perplexity's output:\n{output[-2000:]}")
    return float(found.group(1)), float(found.group(2))


def llama_tokens(gguf: Path, text: str, scratch: Path) -> list[int]:
    """The text as llama.cpp tokenizes it (llama-server's /tokenize, no special tokens added)."""
    server = llama_cpp.llama_server(gguf, scratch, ["--ctx-size", "512"])
    try:
        server.wait_ready(timeout_s=120)
        response = httpx.post(f"{server.base_url}/tokenize", json={"content": text, "add_special": False}, timeout=120)
        return response.raise_for_status().json()["tokens"]
    finally:
        server.stop()


def llama_perplexity(gguf: Path, ctx: int, num_chunks: int, threads: int) -> dict:
    started = time.perf_counter()
    output = llama_cpp.run_tool("llama-perplexity", ["-m", str(gguf), "-f", str(TEXT_PATH), "-c", str(ctx),
                                                     "--chunks", str(num_chunks), "-t", str(threads)])
    ppl, plus_minus = parse_final(output)
    return {"ppl": ppl, "plus_minus": plus_minus, "seconds": time.perf_counter() - started}


@torch.inference_mode()
def rill_perplexity(model_dir: Path, dtype: str, quantization: str, chunks: list[list[int]]) -> dict:
    stride = len(chunks[0]) // 2 - 1
    method = quantization.partition(",")[0]
    config = ModelConfig(model_dir=str(model_dir), block_size=BLOCK_SIZE, quantization=method, enforce_eager=True)
    runner = ModelRunner(config, dtype=getattr(torch, dtype), device="cpu",
                         num_kv_blocks=1 + BATCH * blocks_per_seq(len(chunks[0])), eos_token_ids=[EOS_ID])
    n = len(chunks) * stride
    row = {"dtype": dtype, "quantization": quantization, "scored_tokens": n,
           "ppl_prefill": math.exp(nll_prefill(runner, chunks, stride)[0] / n)}
    if method != "none":
        row["ppl_decode"] = math.exp(nll_decode(runner, chunks, stride)[0] / n)
    return row


def bos_id(gguf: Path) -> int | None:
    """The BOS id where the file's vocabulary adds one (llama-perplexity then puts it first in each chunk)."""
    fields = read_gguf(gguf).fields

    def value(key: str):
        field = fields.get(key)
        return None if field is None or not field.data else field.parts[field.data[0]][0]

    return int(value("tokenizer.ggml.bos_token_id")) if value("tokenizer.ggml.add_bos_token") else None


def run(gguf: Path, ctx: int, num_chunks: int, threads: int, scratch: Path) -> dict:
    model_dir = ensure_gguf_model(gguf, default_cache_dir())
    text = TEXT_PATH.read_text()
    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    theirs = llama_tokens(gguf, text, scratch)
    same = ids[: ctx * num_chunks] == theirs[: ctx * num_chunks]
    if not same:
        raise RuntimeError("llama.cpp and Rill tokenize the text differently: the perplexities would not compare")
    chunks = chunks_of(ids, ctx, num_chunks, bos_id(gguf))
    llama = llama_perplexity(gguf, ctx, num_chunks, threads)
    rows = []
    for dtype, quantization in SIDES:
        # Without the file's name beside it, the loader has no blocks to keep (gguf_dir.source_gguf).
        folder = without_source(model_dir, scratch) if quantization.endswith("from floats") else model_dir
        rows.append(rill_perplexity(folder, dtype, quantization, chunks))
        print(rows[-1], flush=True)
    return {"llama_cpp": llama, "rows": rows, "text_tokens": len(ids), "same_tokens": same, "types": file_types(gguf)}


def file_types(gguf: Path) -> str:
    """The types of the file's 2-D tensors, counted ("Q4_K x 120, Q6_K x 30; embedding Q8_0")."""
    tensors = read_gguf(gguf).tensors
    counts = Counter(t.tensor_type.name for t in tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    embedding = next(t.tensor_type.name for t in tensors if t.name == "token_embd.weight")
    return ", ".join(f"{name} x {n}" for name, n in counts.most_common()) + f"; embedding {embedding}"


def requantized(source: Path, qtype: str) -> Path:
    """`source` as llama-quantize writes it in `qtype`, once, in the bench cache."""
    target = default_cache_dir() / "bench" / "gguf" / f"{source.stem}.{qtype}.gguf"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        llama_cpp.run_tool("llama-quantize", ["--allow-requantize", str(source), str(tmp), qtype])
        tmp.replace(target)
    return target


def markdown(report: dict) -> str:
    p, m, res = report["params"], report["machine"], report["results"]
    llama = res["llama_cpp"]["ppl"]
    rows = [["llama.cpp (`llama-perplexity`)", "the file's own", "prompt", f"{llama:.4f}", "1.0000x"]]
    for r in res["rows"]:
        paths = [("prompt", r["ppl_prefill"])] + ([("decode", r["ppl_decode"])] if "ppl_decode" in r else [])
        rows += [[f"Rill {r['dtype']}", r["quantization"] if r["quantization"] != "none" else "dequantized",
                  path, f"{ppl:.4f}", f"{ppl / llama:.4f}x"] for path, ppl in paths]
    return "\n".join([
        "# Perplexity on the same GGUF: Rill against llama.cpp", "",
        f"`{report['command']}` on {report['date']}: {m.get('cpu_model')} ({' '.join(m.get('cpu_flags', []))}), "
        f"torch {m.get('torch')}, llama.cpp from {llama_cpp.PACKAGE}=={llama_cpp.VERSION}.", "",
        f"File: `{p['gguf']}` ({res.get('types', '')}). Text: bench/data/opticks.txt, {res['text_tokens']} tokens, the same token ids on both "
        f"sides (llama-server's /tokenize); {p['chunks']} chunks of {p['ctx']} tokens, the second half of each scored "
        f"({res['rows'][0]['scored_tokens']} tokens), as `llama-perplexity` scores them. llama.cpp: "
        f"{llama:.4f} +/- {res['llama_cpp']['plus_minus']:.4f}.", "",
        table(["side", "weights", "path", "perplexity", "/ llama.cpp"], rows), ""])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.gguf_quality", description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="the GGUF file (default: the bundled model's)")
    ap.add_argument("--ctx", type=int, default=512, help="tokens per chunk (llama-perplexity's -c)")
    ap.add_argument("--chunks", type=int, default=16, help="chunks scored (llama-perplexity's --chunks)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="llama-perplexity's -t")
    ap.add_argument("--quantize", default=None, help="score the file llama-quantize writes in this type (Q4_K_M, Q4_0)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/gguf_quality-cpu.json"))
    args = ap.parse_args(argv)
    gguf = (args.gguf or bundled_gguf_path()).resolve()
    llama_cpp.install()
    if args.quantize:
        gguf = requantized(gguf, args.quantize)
    with tempfile.TemporaryDirectory() as scratch:
        results = run(gguf, args.ctx, args.chunks, args.threads, Path(scratch))
    report = {"benchmark": "gguf_quality", **provenance("rill.bench.kernels.gguf_quality", argv, None),
              "params": {"gguf": gguf.name, "ctx": args.ctx, "chunks": args.chunks, "threads": args.threads},
              "results": results}
    text = markdown(report)
    save_results(args.out, report, text)
    print(text)
    return report


if __name__ == "__main__":
    main()
