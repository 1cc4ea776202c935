"""Where a GPU engine step's time goes: kernels per step, the GPU's busy time, and the host's share.

    python -m rill.bench.kernels.gpu_step_profile --model DIR [--batch-sizes 1,32] [--prefill-len 512]

For each case (compiled decode steps at each batch size, as `rill serve` runs them, and one eager
prefill) it reports the median wall time of `ModelRunner.execute` (batch in, token ids out), of the
model's forward alone (synchronised), the CUDA kernels one step launches (torch.profiler) and their
summed GPU time, and the kernels that run most often. A device-to-device copy in the same run gives
the memory bandwidth, and with it the floor a decode step cannot beat: the bytes of the weights
read once. The model directory may hold no weights (`--load-format dummy`: random weights).
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from pathlib import Path

import torch

from rill.bench.kernels.engine_step import BlockCounter, NativeDecode, NativePrefill, context_lens, num_blocks_needed
from rill.bench.serving.provenance import provenance
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.ipc.config import ModelConfig


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(num_bytes: int = 2 << 30) -> float:
    """Bytes read plus bytes written per second by a device-to-device copy (the median of 10)."""
    src = torch.empty(num_bytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        sync()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    return 2 * num_bytes / statistics.median(times[2:])


def kernel_profile(step, num_steps: int = 5) -> dict:
    """Kernels per step and their GPU time, from the profiler over num_steps steps."""
    from torch.profiler import ProfilerActivity, profile

    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(num_steps):
            step()
        sync()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not torch.cuda.is_available():  # a dry run on the CPU: its ops stand in
        kernels = [e for e in prof.events() if e.cpu_parent is None]
    by_name = collections.defaultdict(lambda: [0, 0.0])
    for e in kernels:
        entry = by_name[e.name[:90]]
        entry[0] += 1
        entry[1] += e.device_time_total
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:25]
    return {"kernels_per_step": len(kernels) / num_steps,
            "gpu_busy_ms_per_step": sum(e.device_time_total for e in kernels) / num_steps / 1e3,
            "top_kernels": [{"name": n, "per_step": c / num_steps, "us_per_step": t / num_steps} for n, (c, t) in top]}


def timed(step, num_steps: int = 30) -> float:
    """The median wall ms of step()."""
    for _ in range(3):
        step()
    times = []
    for _ in range(num_steps):
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def host_profile(runner: ModelRunner, blocks: BlockCounter, steps: int) -> list[str]:
    """cProfile's top functions by their own time over 50 decode steps of one row: the host's share."""
    import cProfile
    import io
    import pstats

    decode = NativeDecode(runner, context_lens(1), steps, blocks)
    step = lambda: runner.execute(Batch([ScheduledSeq(r, r.num_computed_tokens, 1) for r in decode.reqs]))  # noqa: E731
    step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(50):
        step()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue().splitlines()


def forward_only(runner: ModelRunner, batch_of):
    """The step's logits alone (no sampling, no token ids to the host), for the same batch."""
    return lambda: runner.compute_logits(batch_of())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.gpu_step_profile", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--batch-sizes", default="1,32")
    ap.add_argument("--prefill-len", type=int, default=512)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself")
    ap.add_argument("--eager", action="store_true", help="decode eagerly too (no CUDA graphs)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    steps = 80
    started = time.perf_counter()
    runner = ModelRunner(ModelConfig(model_dir=str(args.model), block_size=16, load_format="dummy",
                                     enforce_eager=args.eager, max_num_seqs=max(batch_sizes)),
                         dtype=dtype, device=args.device, eos_token_ids=[2],
                         num_kv_blocks=num_blocks_needed(batch_sizes + [1], steps, args.prefill_len))
    start_s = time.perf_counter() - started
    tensors = {t.data_ptr(): t for t in [*runner.model.parameters(), *runner.model.buffers()]}
    weight_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    bandwidth = copy_bandwidth() if args.device == "cuda" else 1e12
    report = {"benchmark": "gpu_step_profile", **provenance("rill.bench.kernels.gpu_step_profile", argv, "gpu"),
              "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None, "runner_start_s": start_s, "weight_bytes": weight_bytes,
              "copy_bandwidth_gb_s": bandwidth / 1e9, "weight_read_floor_ms": weight_bytes / bandwidth * 1e3,
              "compiled_decode": runner.decode_graphs is not None, "cases": {}}
    blocks = BlockCounter()
    for b in batch_sizes:
        lens = context_lens(b)
        decode = NativeDecode(runner, lens, steps, blocks)
        # The same batch every time: the steps rewrite one position (cost as a real step's).
        batch = lambda d=decode: Batch([ScheduledSeq(r, r.num_computed_tokens, 1) for r in d.reqs])  # noqa: E731
        case = {"execute_ms": timed(lambda d=decode: runner.execute(batch(d))),
                "forward_ms": timed(forward_only(runner, batch)), **kernel_profile(lambda d=decode: runner.execute(batch(d)))}
        report["cases"][f"decode batch {b}"] = case
    report["host_profile_decode_batch_1"] = host_profile(runner, blocks, steps)
    prompt = torch.randint(3, runner.vocab_size, (args.prefill_len,), generator=torch.Generator().manual_seed(0)).tolist()
    prefill = NativePrefill(runner, prompt, blocks)
    report["cases"][f"prefill {args.prefill_len}"] = {"execute_ms": timed(prefill.step, 10),
                                                       **kernel_profile(prefill.step, 2)}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
