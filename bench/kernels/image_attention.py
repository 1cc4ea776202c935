"""What Gemma 3's images cost a prompt step's attention, as the transformers route runs it: where no window masks,
a chunk that holds an image whose tokens attend both ways takes the CPU backend's prompt kernel as text does, and
the image's rows again over the whole image (masked.py attend_whole_images); past a sliding layer's window,
masked.py with each row's key limit. One process, Gemma 3 4B's attention shape (8 query heads, 4 KV
heads of 256, a window of 1,024; 29 sliding layers and 5 global), bfloat16, blocks of 16; the chunk is 22 text
tokens, an image's 256 and 22 more, after `--context` tokens already in the cache.

    python -m rill.bench.kernels.image_attention [--context 0 1000] [--rounds 20] [--out F.json]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.attention.choice import create_attention_backend
from rill.engine_proc.kernels import extension
from rill.engine_proc.model.hf_attention import PagedStep, paged_attention_forward, step_context
from rill.engine_proc.model.hf_vision import whole_images
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
    """Median ms of one layer's attention over the chunk, its K/V write included, as the transformers route runs it
    (hf_attention.py's paged_attention_forward), for a chunk of text and one with the image, in a global layer and
    in a sliding one."""
    torch.manual_seed(0)
    backend = create_attention_backend("cpu", torch.device("cpu"), torch.bfloat16, BLOCK)
    num_tokens = TEXT + IMAGE + TEXT
    num_blocks = -(-(context + num_tokens) // BLOCK) + 1
    caches = SimpleNamespace(k_caches=[torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)],
                             v_caches=[torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)])
    q = torch.randn(1, Q_HEADS, num_tokens, HEAD_DIM, dtype=torch.bfloat16)
    k, v = (torch.randn(1, KV_HEADS, num_tokens, HEAD_DIM, dtype=torch.bfloat16) for _ in range(2))
    layer = SimpleNamespace(layer_idx=0)
    runs = {}
    for with_image in (False, True):
        batch = chunk(context, with_image)
        _, positions, meta, _ = backend.prepare(batch)
        step = PagedStep(backend, caches, meta, batch, positions, context + num_tokens,
                         images=whole_images(batch, decodes_first=True))
        assert bool(step.images) == with_image
        for kind, window in (("global", None), ("sliding", WINDOW)):
            def run(step=step, window=window):
                with step_context(step):
                    return paged_attention_forward(layer, q, k, v, None, sliding_window=window)
            runs[f"{kind}, {'image' if with_image else 'text'}"] = run
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
        step = {name: SLIDING * ms[f"sliding, {name}"] + GLOBAL * ms[f"global, {name}"] for name in ("text", "image")}
        results.append({"context": context, "layer_ms": ms, "step_ms": step, "ratio": step["image"] / step["text"]})
        rows.append([context, *(f"{ms[name]:.2f}" for name in ("global, text", "global, image", "sliding, text",
                                                                "sliding, image")),
                     f"{step['text']:.1f}", f"{step['image']:.1f}", f"**{step['image'] / step['text']:.2f}x**"])
    report = {**provenance("rill.bench.kernels.image_attention", argv, args.machine),
              "params": {"context": args.context, "rounds": args.rounds, "threads": torch.get_num_threads(),
                         "shape": {"q_heads": Q_HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM, "window": WINDOW,
                                   "sliding_layers": SLIDING, "global_layers": GLOBAL, "block": BLOCK}},
              "results": results}
    summary = "\n".join([
        "# Gemma 3's images: a prompt chunk's attention, image against text", "",
        f"`{report['command']}` on {report['date']}, {report['machine']['cpu_model']}, {torch.get_num_threads()} "
        f"threads; medians of {args.rounds} interleaved rounds. One layer's attention as the transformers route runs "
        f"it (hf_attention.py), its K/V write included, over a chunk of {TEXT} + {IMAGE} + {TEXT} tokens after "
        f"`context` cached ones, ms, and a {SLIDING + GLOBAL}-layer step's ({SLIDING} sliding layers of {WINDOW}, "
        f"{GLOBAL} global). Text: the CPU backend's prompt kernel, or masked.py in a sliding layer past its window; "
        "image: the kernel and the image's rows again over the whole image where no window masks, else masked.py "
        "with each row's key limit.", "",
        table(["context", "global, text", "global, image", "sliding, text", "sliding, image",
               f"{SLIDING + GLOBAL} layers, text", f"{SLIDING + GLOBAL} layers, image", "image / text"], rows), ""])
    save_results(args.out, report, summary)
    print(summary)
    return report


if __name__ == "__main__":
    main()
