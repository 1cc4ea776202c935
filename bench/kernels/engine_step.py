"""Engine step time: our ModelRunner against transformers' own model, interleaved in one process.

    python -m rill.bench.kernels.engine_step [--quick] [--batch-sizes 1,8,32] [--dtype float32] [--device cpu]

Decode: each batch row has a context of 128 to 256 tokens (spread evenly; 192 at batch 1) and
runs one token per step; the step's time is `ModelRunner.execute` (inputs, model, greedy
sampler) against transformers' forward with its DynamicCache (left-padded, attention mask,
position ids) plus the argmax to a list. The KV contents are not computed (zeros in our
cache, random in transformers'): attention costs the same whatever the values. After each
round both caches are cut back to the starting contexts, so every round measures the same
work. Prefill: one 512-token prompt, transformers with `logits_to_keep=1` as its generate does.
Two more runners over the same weights run every case too: one in the --batch-invariant mode
(padded contexts, rows of their own, row-tiled linears), and one with the decode steps compiled as
`rill serve` runs them by default (decode only: prefill runs eagerly there too). So what the
mode costs and what compiling saves are measured against the eager default in the same run.
The two alternate step by step, who goes first alternating by round; medians over all timed steps.
With --device cuda both sides run on the GPU (Rill with its Triton kernels, its compiled runner with
a CUDA graph per padded batch size), without the --batch-invariant runner, which has no GPU path.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.utils import logging as hf_logging

from rill.bench.kernels.linear_kernels import kernel_choice
from rill.bench.serving.markdown import number, table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.model.bundled import ensure_bundled_model
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.config import ModelConfig
from rill.ipc.protocol import SamplingParams
from rill.launcher import ENGINE_ENV_DEFAULTS, set_engine_env_defaults

BLOCK_SIZE = 16
MIN_CONTEXT_LEN, MAX_CONTEXT_LEN = 128, 256
WARMUP_STEPS = 2
GREEDY = SamplingParams(max_tokens=1 << 20, temperature=0.0)


def context_lens(batch_size: int) -> list[int]:
    if batch_size == 1:
        return [(MIN_CONTEXT_LEN + MAX_CONTEXT_LEN) // 2]
    span = MAX_CONTEXT_LEN - MIN_CONTEXT_LEN
    return [MIN_CONTEXT_LEN + span * i // (batch_size - 1) for i in range(batch_size)]


class BlockCounter:
    """Hands out block ids 1, 2, 3, ...: block 0 is the padding block of decode block tables."""

    def __init__(self) -> None:
        self.next_id = 1

    def cover(self, req: EngineRequest, num_tokens: int) -> None:
        while len(req.block_ids) * BLOCK_SIZE < num_tokens:
            req.block_ids.append(self.next_id)
            self.next_id += 1


def num_blocks_needed(batch_sizes: list[int], num_steps: int, prefill_len: int) -> int:
    blocks = lambda n: -(-n // BLOCK_SIZE)  # noqa: E731
    num_steps = max(num_steps, WARMUP_STEPS)
    decode = sum(blocks(n + num_steps) for b in batch_sizes for n in context_lens(b))
    return 1 + decode + blocks(prefill_len)  # each runner has a cache of its own


class NativeDecode:
    """Rows whose contexts are in our KV cache; each step computes and samples one token per row."""

    def __init__(self, runner: ModelRunner, lens: list[int], max_steps: int, blocks: BlockCounter):
        gen = torch.Generator().manual_seed(len(lens))
        self.runner, self.lens = runner, lens
        self.reqs = [EngineRequest(f"r{i}", "w", torch.randint(3, runner.vocab_size, (n,), generator=gen).tolist(),
                                   GREEDY) for i, n in enumerate(lens)]
        for req in self.reqs:
            blocks.cover(req, req.num_prompt_tokens + max(max_steps, WARMUP_STEPS))
        self.reset()

    def reset(self) -> None:
        for req in self.reqs:
            req.output_ids = []
            req.num_computed_tokens = req.num_prompt_tokens - 1  # the last prompt token runs as a decode

    def step(self) -> float:
        batch = Batch([ScheduledSeq(r, r.num_computed_tokens, 1) for r in self.reqs])
        start_s = time.perf_counter()
        sampled = self.runner.execute(batch)
        elapsed_s = time.perf_counter() - start_s
        for req, token_id in zip(self.reqs, sampled):
            req.num_computed_tokens += 1
            req.output_ids.append(token_id)
        return elapsed_s


class HFDecode:
    """The same rows in transformers: left-padded to the longest, a DynamicCache, a 2D mask."""

    def __init__(self, model, lens: list[int]):
        config, dtype, device = model.config, model.dtype, model.device
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        gen = torch.Generator().manual_seed(len(lens))
        self.model, self.num_cached = model, max(lens) - 1
        self.cache = DynamicCache(config=config)
        shape = (len(lens), config.num_key_value_heads, self.num_cached, head_dim)
        for layer in range(config.num_hidden_layers):
            self.cache.update(torch.randn(shape, generator=gen).to(device, dtype),
                              torch.randn(shape, generator=gen).to(device, dtype), layer)
        key_pos = torch.arange(self.num_cached)
        self.start_mask = (key_pos >= self.num_cached - torch.tensor(lens).unsqueeze(1) + 1).long().to(device)
        self.start_positions = (torch.tensor(lens).unsqueeze(1) - 1).to(device)
        self.next_ids = torch.randint(3, config.vocab_size, (len(lens), 1), generator=gen).to(device)
        self.reset()

    def reset(self) -> None:
        num_new = self.cache.get_seq_length() - self.num_cached
        if num_new:
            self.cache.crop(-num_new)
        self.mask, self.positions = self.start_mask, self.start_positions

    @torch.inference_mode()
    def step(self) -> float:
        start_s = time.perf_counter()
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.mask), 1)], dim=1)
        out = self.model(input_ids=self.next_ids, attention_mask=self.mask, position_ids=self.positions,
                         past_key_values=self.cache, use_cache=True)
        next_ids = out.logits[:, -1].argmax(dim=-1, keepdim=True)
        next_ids.view(-1).tolist()  # what a server does with the sampled ids next
        elapsed_s = time.perf_counter() - start_s
        self.next_ids, self.positions = next_ids, self.positions + 1
        return elapsed_s


class NativePrefill:
    def __init__(self, runner: ModelRunner, prompt_ids: list[int], blocks: BlockCounter):
        self.runner = runner
        self.req = EngineRequest("p", "w", prompt_ids, GREEDY)
        blocks.cover(self.req, len(prompt_ids))

    def step(self) -> float:
        self.req.output_ids, self.req.num_computed_tokens = [], 0
        batch = Batch([ScheduledSeq(self.req, 0, self.req.num_prompt_tokens)])
        start_s = time.perf_counter()
        self.runner.execute(batch)
        return time.perf_counter() - start_s


class HFPrefill:
    def __init__(self, model, prompt_ids: list[int]):
        self.model, self.input_ids = model, torch.tensor([prompt_ids], device=model.device)

    @torch.inference_mode()
    def step(self) -> float:
        start_s = time.perf_counter()
        out = self.model(input_ids=self.input_ids, past_key_values=DynamicCache(config=self.model.config),
                         use_cache=True, logits_to_keep=1)
        out.logits[:, -1].argmax(dim=-1).tolist()
        return time.perf_counter() - start_s


def measure(pairs: dict[str, dict], rounds: int, num_steps: int) -> dict[str, dict[str, list[float]]]:
    """pairs: case -> {"native": impl, "transformers": impl}; per case and impl, the step times.

    The two alternate step by step (who goes first alternates by round), so a burst of load
    from elsewhere on the machine lands on both alike.
    """
    times = {case: {name: [] for name in impls} for case, impls in pairs.items()}
    for r in range(-1, rounds):  # round -1 warms up (oneDNN primitives, allocator) and is dropped
        for case, impls in pairs.items():
            names = list(impls) if r % 2 == 0 else list(impls)[::-1]
            for _ in range(num_steps if r >= 0 else WARMUP_STEPS):
                for name in names:
                    elapsed_s = impls[name].step()
                    if r >= 0:
                        times[case][name].append(elapsed_s)
            for impl in impls.values():
                if hasattr(impl, "reset"):
                    impl.reset()
    return times


def summarize(times: dict, tokens_per_step: dict[str, int]) -> dict:
    out = {}
    for case, by_impl in times.items():
        row = {}
        for name, steps_s in by_impl.items():
            ms = 1e3 * statistics.median(steps_s)
            row[name] = {"ms_per_step": ms, "tokens_per_s": tokens_per_step[case] / ms * 1e3,
                         "min_ms": 1e3 * min(steps_s), "num_steps": len(steps_s)}
        row["native/transformers"] = {
            "ms_per_step": row["native"]["ms_per_step"] / row["transformers"]["ms_per_step"],
            "tokens_per_s": row["native"]["tokens_per_s"] / row["transformers"]["tokens_per_s"]}
        if "invariant" in row:  # not on a GPU: --batch-invariant is not built for the Triton path
            row["invariant/native"] = {"ms_per_step": row["invariant"]["ms_per_step"] / row["native"]["ms_per_step"]}
        if "compiled" in row:  # decode steps only: prefill runs eagerly in `rill serve` too
            row["compiled/native"] = {"ms_per_step": row["compiled"]["ms_per_step"] / row["native"]["ms_per_step"]}
        out[case] = row
    return out


def markdown(report: dict) -> str:
    p, m = report["params"], report["machine"]
    rows = [[case, number(row["native"]["ms_per_step"]), number(row["transformers"]["ms_per_step"]),
             number(row["native"]["tokens_per_s"]), number(row["transformers"]["tokens_per_s"]),
             f"{row['native/transformers']['ms_per_step']:.2f}", f"{row['native/transformers']['tokens_per_s']:.2f}",
             number(row["invariant"]["ms_per_step"]) if "invariant" in row else "–",
             f"{row['invariant/native']['ms_per_step']:.2f}" if "invariant" in row else "–",
             number(row["compiled"]["ms_per_step"]) if "compiled" in row else "–",
             f"{row['compiled/native']['ms_per_step']:.2f}" if "compiled" in row else "–"]
            for case, row in report["results"].items()]
    out = [f"# Engine step: native ModelRunner vs transformers ({m['name']})", "",
           f"- command: `{report['command']}`", f"- date: {report['date']}",
           f"- machine: {m['cpu_count']} CPUs, {m['cpu_model']} (flags: {' '.join(m.get('cpu_flags', []))}), "
           + (f"GPU {m['gpu']}, " if m.get("gpu") else "") +
           f"torch {m['torch']} ({p['torch_threads']} threads), "
           f"transformers {m['transformers']}, load {m['load_avg_1m_start']:.2f} at start",
           f"- model: {p['model']} ({p['dtype']}, on {p.get('device', 'cpu')}), {p['rounds']} interleaved rounds x {p['num_steps']} steps, medians",
           *([f"- bfloat16 linears' micro-kernel: {k['kernel']}; environment: {k['env'] or 'none set'}"]
             if (k := p.get("linear_kernel")) else []),
           "", "Ratios native/transformers: below 1 in time, above 1 in tokens/s means ours is faster.", "",
           table(["case", "native ms/step", "transformers ms/step", "native tok/s", "transformers tok/s",
                  "time native/transformers", "tok/s native/transformers", "--batch-invariant ms/step",
                  "time invariant/native", "compiled ms/step", "time compiled/native"], rows),
           "## How it is measured", "", *__doc__.splitlines()[4:]]
    return "\n".join(out) + "\n"


def load_transformers(model_dir: Path, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """transformers' model from the directory; random weights when it holds none (a tiny config)."""
    hf_logging.disable_progress_bar()
    if any(model_dir.glob("*.safetensors")):
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval().to(device)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir), dtype=dtype).eval().to(device)


def run(model_dir: Path, batch_sizes: list[int], dtype: torch.dtype, rounds: int, num_steps: int,
        prefill_len: int, device: str = "cpu") -> tuple[dict, dict]:
    num_blocks = num_blocks_needed(batch_sizes, num_steps, prefill_len)
    # Our runners over the same weights' files (random, as transformers' are, when it holds none): the
    # eager default, the compiled decode steps of `rill serve`'s default (CUDA graphs on a GPU), and
    # the --batch-invariant mode (padded contexts and row-tiled linears; CPU only).
    load_format = "auto" if any(model_dir.glob("*.safetensors")) else "dummy"
    make = lambda enforce_eager=True, **kw: ModelRunner(  # noqa: E731
        ModelConfig(model_dir=str(model_dir), block_size=BLOCK_SIZE, load_format=load_format, enforce_eager=enforce_eager,
                    **kw), dtype=dtype, device=device, num_kv_blocks=num_blocks, eos_token_ids=[2])
    runner, hf = make(), load_transformers(model_dir, dtype, device)
    runners = {"native": runner, "compiled": make(enforce_eager=False, max_num_seqs=max(batch_sizes))}
    if device == "cpu":
        runners["invariant"] = make(batch_invariant=True)
    counters = {name: BlockCounter() for name in runners}  # a cache each
    pairs, tokens_per_step = {}, {}
    for b in batch_sizes:
        lens = context_lens(b)
        pairs[f"decode batch {b}"] = {"native": NativeDecode(runner, lens, num_steps, counters["native"]),
                                      "transformers": HFDecode(hf, lens),
                                      **{name: NativeDecode(r, lens, num_steps, counters[name])
                                         for name, r in runners.items() if name != "native"}}
        tokens_per_step[f"decode batch {b}"] = b
    prompt_ids = torch.randint(3, runner.vocab_size, (prefill_len,), generator=torch.Generator().manual_seed(0))
    case = f"prefill {prefill_len} tokens"
    pairs[case] = {"native": NativePrefill(runner, prompt_ids.tolist(), counters["native"]),
                   "transformers": HFPrefill(hf, prompt_ids.tolist())}
    if "invariant" in runners:
        pairs[case]["invariant"] = NativePrefill(runners["invariant"], prompt_ids.tolist(), counters["invariant"])
    tokens_per_step[case] = prefill_len
    params = {"model": str(model_dir), "device": device, "num_kv_blocks": num_blocks, "block_size": BLOCK_SIZE,
              "engine_env": {name: os.environ.get(name) for name in ENGINE_ENV_DEFAULTS},
              "linear_kernel": kernel_choice() if device == "cpu" else None,
              "context_lens": {b: context_lens(b) for b in batch_sizes},
              "hf_attn_implementation": hf.config._attn_implementation}
    return summarize(measure(pairs, rounds, num_steps), tokens_per_step), params


def main(argv: list[str] | None = None) -> dict:
    set_engine_env_defaults()  # the engine's environment (huge pages for large tensors), as `rill serve` gives it
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.engine_step", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 steps, 1 round, a 64-token prefill: checks that it runs")
    ap.add_argument("--batch-sizes", default="1,8,32", help="decode batch sizes, comma-separated")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 1)")
    ap.add_argument("--steps", type=int, default=None, help="decode steps per round (default 8, quick 2)")
    ap.add_argument("--prefill-len", type=int, default=None, help="prefill prompt tokens (default 512, quick 64)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: both sides on the GPU, Rill with its Triton kernels and CUDA-graph decode steps")
    ap.add_argument("--num-threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    ap.add_argument("--model", type=Path, default=None, help="a model directory (default: the bundled SmolLM2-135M); "
                    "without weight files both sides get random weights")
    ap.add_argument("--machine", default=None, help="machine name in the result file name (default: hostname)")
    ap.add_argument("--out", type=Path, default=None, help="the .json path (a .md goes beside it)")
    args = ap.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    rounds = args.rounds or (1 if args.quick else 5)
    num_steps = args.steps or (2 if args.quick else 8)
    prefill_len = args.prefill_len or (64 if args.quick else 512)
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    model_dir = args.model or ensure_bundled_model()
    results, extra = run(model_dir, batch_sizes, getattr(torch, args.dtype), rounds, num_steps, prefill_len,
                         args.device)
    report = {"benchmark": "engine_step", **provenance("rill.bench.kernels.engine_step", argv, args.machine),
              "params": {"dtype": args.dtype, "batch_sizes": batch_sizes, "rounds": rounds,
                                             "num_steps": num_steps, "prefill_len": prefill_len, "quick": args.quick,
                                             "torch_threads": torch.get_num_threads(), **extra},
              "results": results}
    if args.device == "cuda":
        report["machine"]["gpu"] = torch.cuda.get_device_name()
    suffix = "" if args.device == "cpu" else f"-{args.device}"
    out = args.out or Path(f"bench/results/engine_step-{args.dtype}{suffix}-{report['machine']['name']}.json")
    save_results(out, report, markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
