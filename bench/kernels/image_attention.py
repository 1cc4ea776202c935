"""What Gemma 3's images cost a prompt step's attention: a chunk that holds an image whose tokens attend both ways
goes through engine_proc/attention/masked.py (torch over the gathered blocks, each image token up to its image's
last) in every layer, where a text chunk of the same length takes the CPU backend's prompt kernel in the global
layers, and in the sliding ones too where the window masks nothing (else masked.py, windowed). One process, Gemma 3 4B's attention shape (8 query heads, 4 KV
heads of 256, a window of 1,024; 29 sliding layers and 5 global), bfloat16, blocks of 16; the chunk is 22 text
tokens, an image's 256 and 22 more, after `--context` tokens already in the cache.

    python -m rill.bench.kernels.image_attention [--context 0 1000] [--rounds 20] [--out F.json]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.attention.choice import create_attention_backend
from rill.engine_proc.attention.masked import masked_attention, token_tables
from rill.engine_proc.kernels import extension
from rill.engine_proc.model.hf_vision import key_limits
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.images import image_inputs
from rill.ipc.protocol import SamplingParams

Q_HEADS, KV_HEADS, HEAD_DIM, WINDOW, BLOCK = 8, 4, 256, 1024, 16
SLIDING, GLOBAL = 29, 5
IMAGE_TOKEN, TEXT, IMAGE = 7, 22, 256


def chunk(context: int, with_image: bool) -> Batch:
    """A step of one prompt chunk: `TEXT` + `IMAGE` + `TEXT` tokens after `context` cached ones."""
    middle = [IMAGE_TOKEN if with_image else 9] * IMAGE
    ids = [9] * (context + TEXT) + middle + [9] * TEXT
    images = image_inputs({"pixel_values": np.zeros(1, np.float32)}, IMAGE_TOKEN, bidirectional=True)
    req = EngineRequest("r", "w", ids, SamplingParams(max_tokens=1, images=images if with_image else None))
    req.block_ids = list(range(1, -(-len(ids) // BLOCK) + 1))
    return Batch([ScheduledSeq(req, context, len(ids) - context)])


def layer_ms(context: int, rounds: int) -> dict[str, float]:
    """Median ms of one layer's attention over the chunk (its K/V write included), each way."""
    torch.manual_seed(0)
    backend = create_attention_backend("cpu", torch.device("cpu"), torch.bfloat16, BLOCK)
    num_tokens = TEXT + IMAGE + TEXT
    num_blocks = -(-(context + num_tokens) // BLOCK) + 1
    k_cache, v_cache = (torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    q = torch.randn(num_tokens, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    k, v = (torch.randn(num_tokens, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    steps = {}
    for with_image in (False, True):
        batch = chunk(context, with_image)
        _, positions, meta, _ = backend.prepare(batch)
        limits = key_limits(batch, positions, decodes_first=True)
        assert (limits is not None) == with_image
        steps[with_image] = meta, token_tables(batch, BLOCK, positions, decodes_first=True), limits

    def kernel():
        return backend.forward(q, k, v, k_cache, v_cache, steps[False][0])

    def masked(with_image: bool, window: int | None):
        meta, tables, limits = steps[with_image]
        backend.write(k_cache, v_cache, k, v, meta.slot_mapping)
        return masked_attention(q, k_cache, v_cache, tables, HEAD_DIM**-0.5, window, key_limits=limits)

    runs = {"kernel": kernel, "masked, window": lambda: masked(False, WINDOW),
            "masked, image": lambda: masked(True, None), "masked, window, image": lambda: masked(True, WINDOW)}
    times = {name: [] for name in runs}
    for i in range(rounds + 3):  # interleaved, three rounds to warm up
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            if i >= 3:
                times[name].append((time.perf_counter() - start) * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.image_attention", description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, nargs="+", default=[0, 1000], help="tokens in the cache before the chunk")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results/image_attention-cpu.json"))
    args = ap.parse_args(argv)
    if not extension.available():
        raise SystemExit("the CPU kernels are not built: nothing to measure")
    results, rows = [], []
    for context in args.context:
        ms = layer_ms(context, args.rounds)
        within = context + TEXT + IMAGE + TEXT <= WINDOW  # the window masks nothing: the sliding layers' kernel
        step = {"text, masked.py in sliding layers": SLIDING * ms["masked, window"] + GLOBAL * ms["kernel"],
                "text": (SLIDING * ms["kernel" if within else "masked, window"] + GLOBAL * ms["kernel"]),
                "image": SLIDING * ms["masked, window, image"] + GLOBAL * ms["masked, image"]}
        results.append({"context": context, "layer_ms": ms, "step_ms": step})
        rows.append([context, *(f"{ms[name]:.2f}" for name in ms), *(f"{value:.1f}" for value in step.values()),
                     f"**{step['image'] / step['text']:.2f}x**"])
    report = {**provenance("rill.bench.kernels.image_attention", argv, args.machine),
              "params": {"context": args.context, "rounds": args.rounds, "threads": torch.get_num_threads(),
                         "shape": {"q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "window": WINDOW,
                                   "sliding_layers": SLIDING, "global_layers": GLOBAL, "block": BLOCK}},
              "results": results}
    summary = "\n".join([
        "# Gemma 3's images: a prompt chunk's attention, image against text", "",
        f"`{report['command']}` on {report['date']}, {report['machine']['cpu_model']}, {torch.get_num_threads()} "
        f"threads; medians of {args.rounds} interleaved rounds. One layer's attention, its K/V write included, over a "
        f"chunk of {TEXT} + {IMAGE} + {TEXT} tokens after `context` cached ones, ms: the CPU backend's prompt kernel "
        "(text), and masked.py with the sliding window, with the image's tokens seeing the whole image, or both. "
        f"A {SLIDING + GLOBAL}-layer step's attention ({SLIDING} sliding layers, {GLOBAL} global), ms: text as "
        "before this change (masked.py in every sliding layer), text now (the kernel where the window masks "
        "nothing: the step's sequences no longer than it), and a chunk with the image (masked.py in every layer).",
        "",
        table(["context", "kernel", "masked.py, window", "masked.py, image", "masked.py, window and image",
               "step: text, before", "step: text, now", "step: image", "image / text now"], rows), ""])
    save_results(args.out, report, summary)
    print(summary)
    return report


if __name__ == "__main__":
    main()
