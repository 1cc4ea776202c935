"""`python -m rill.bench.kernels.quant_quality`: what `--quantization int8` and `int4` cost in quality, and what they buy.

The bundled model is loaded through Rill's own ModelRunner (engine_proc/model/loader.load_model)
in float32 and bfloat16, each with quantization none and each of `--methods` (int8, int4). int4 keeps the bundled
file's Q4_1 blocks as they are; `int4-floats` quantizes its dequantized weights again instead, as a float checkpoint's
are, and `int4-sym`, `int4-g128` and `int4-sym-g128` so with --int4-symmetric and --int4-group-size 128. For each:

- perplexity on bench/data/opticks.txt (see bench/data/README.md) with a sliding window of
  `--window` tokens moved `--stride` tokens at a time; each window scores its last `--stride`
  tokens, so every scored token has at least window - stride tokens of context. Measured twice,
  as the two int8 paths serve them: `prefill` runs each window as one prompt with logits at
  every scored position (int8: the dequantized path), `decode` prefills the context and then
  feeds the scored tokens one step at a time, 8 windows a step (int8: the int8 kernel); and at
  each scored position whether the most likely next token is the unquantized model's (top-1);
- greedy agreement with the unquantized model of the same dtype over `--num-prompts` prompts
  (the chat prompts of bench/data/conversations.jsonl through the chat template, then excerpts
  of the text past the perplexity part), `--new-tokens` greedy tokens each, 8 prompts a batch:
  the share of prompts whose tokens are all identical, and the mean share of tokens before the
  first divergence. bfloat16 against float32 (both unquantized) is given as the yardstick of how
  much a change of rounding alone moves greedy outputs of this model;
- the weights' memory, and the time of a 512-token prefill and of a decode step at batch 1 and 8
  (interleaved over rounds across the four models, medians: the machines are noisy).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import Tokenizer

from rill.bench.kernels.int4_linears import SCHEMES
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.model.bundled import ensure_bundled_model
from rill.engine_proc.model.gguf_dir import SOURCE_FILE_NAME
from rill.engine_proc.model.runner import ModelRunner
from rill.engine_proc.model.step_inputs import prepare_step
from rill.engine_proc.sched.batch import Batch, ScheduledSeq
from rill.engine_proc.sched.request import EngineRequest
from rill.ipc.config import ModelConfig
from rill.ipc.protocol import SamplingParams

FROM_FLOATS = {"int4-floats": (32, False), **SCHEMES}  # method: int4's (group size, symmetric), from floats
DATA_DIR = Path(__file__).parents[1] / "data"
TEXT_PATH = DATA_DIR / "opticks.txt"
CONVERSATIONS_PATH = DATA_DIR / "conversations.jsonl"
BLOCK_SIZE = 16
BATCH = 8  # seqs per step: decode steps of 8 rows run the int8 kernel (quantization.KERNEL_MAX_ROWS)
EOS_ID = 2
FULL = {"ppl_tokens": 4352, "window": 512, "stride": 256, "num_prompts": 120, "new_tokens": 32,
        "rounds": 5, "prefill_tokens": 512, "timed_steps": 16}
QUICK = {"ppl_tokens": 96, "window": 64, "stride": 32, "num_prompts": 8, "new_tokens": 4,
         "rounds": 1, "prefill_tokens": 32, "timed_steps": 2}


def new_request(req_id: str, ids: list[int], first_block: int, num_tokens: int, max_tokens: int = 1) -> EngineRequest:
    """A request whose KV blocks are [first_block, ...) for `num_tokens` tokens (one batch at a time)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, min_tokens=max_tokens)
    req = EngineRequest(req_id, "bench", list(ids), params)
    req.block_ids = list(range(first_block, first_block + -(-num_tokens // BLOCK_SIZE)))
    return req


def without_source(model_dir: Path, scratch: Path) -> Path:
    """A view of a converted directory (links to its files) without the note of the GGUF it came from."""
    view = scratch / "from-floats"
    view.mkdir(exist_ok=True)
    for path in model_dir.iterdir():
        if path.name != SOURCE_FILE_NAME and not (view / path.name).exists():
            (view / path.name).symlink_to(path)
    return view



def blocks_per_seq(num_tokens: int) -> int:
    return -(-num_tokens // BLOCK_SIZE)


@torch.inference_mode()
def nll_prefill(runner: ModelRunner, windows: list[list[int]], stride: int) -> tuple[float, list[int]]:
    """Summed negative log-likelihood of each window's last `stride` tokens, one prompt per window,
    and the model's top-1 prediction at each of them."""
    total, top1 = 0.0, []
    for ids in windows:
        req = new_request("w", ids, 1, len(ids))
        input_ids, positions, meta, _ = prepare_step(Batch([ScheduledSeq(req, 0, len(ids))]), BLOCK_SIZE, runner.device)
        rows = torch.arange(len(ids) - stride - 1, len(ids) - 1)
        logits = runner.model(input_ids, positions, meta, runner.kv_cache, rows).float()
        targets = torch.tensor(ids[len(ids) - stride:])
        total -= logits.log_softmax(-1).gather(1, targets.unsqueeze(1)).sum().item()
        top1 += logits.argmax(-1).tolist()
    return total, top1


@torch.inference_mode()
def nll_decode(runner: ModelRunner, windows: list[list[int]], stride: int) -> tuple[float, list[int]]:
    """The same scores, fed as served: the context as a prompt, then one token per step, BATCH windows a step."""
    total, top1 = 0.0, [0] * (len(windows) * stride)
    for start in range(0, len(windows), BATCH):
        group = windows[start:start + BATCH]
        reqs = [new_request(f"w{i}", ids[:-stride], 1 + i * blocks_per_seq(len(ids)), len(ids))
                for i, ids in enumerate(group)]
        seqs = [ScheduledSeq(r, 0, r.num_tokens) for r in reqs]
        for step in range(stride):
            logits = runner.compute_logits(Batch(seqs)).float()
            targets = torch.tensor([ids[len(ids) - stride + step] for ids in group])
            total -= logits.log_softmax(-1).gather(1, targets.unsqueeze(1)).sum().item()
            for i, token_id in enumerate(logits.argmax(-1).tolist()):
                top1[(start + i) * stride + step] = token_id  # in nll_prefill's order
            for seq, target in zip(seqs, targets.tolist()):
                seq.req.num_computed_tokens = seq.start_pos + seq.num_new_tokens
                seq.req.output_ids.append(target)
            seqs = [ScheduledSeq(r, r.num_computed_tokens, 1) for r in reqs]
    return total, top1


@torch.inference_mode()
def greedy(runner: ModelRunner, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """`new_tokens` greedy tokens for each prompt (eos held back, as min_tokens does), BATCH prompts a batch."""
    outputs = []
    for start in range(0, len(prompts), BATCH):
        group = prompts[start:start + BATCH]
        num_blocks = blocks_per_seq(max(map(len, group)) + new_tokens)
        reqs = [new_request(f"g{i}", ids, 1 + i * num_blocks, len(ids) + new_tokens, new_tokens)
                for i, ids in enumerate(group)]
        seqs = [ScheduledSeq(r, 0, r.num_tokens) for r in reqs]
        for _ in range(new_tokens):
            sampled = runner.execute(Batch(seqs))
            for seq, token_id in zip(seqs, sampled):
                seq.req.num_computed_tokens = seq.start_pos + seq.num_new_tokens
                seq.req.output_ids.append(token_id)
            seqs = [ScheduledSeq(r, r.num_computed_tokens, 1) for r in reqs]
        outputs += [r.output_ids for r in reqs]
    return outputs


def top1_agreement(reference: list[int], other: list[int]) -> float:
    return sum(a == b for a, b in zip(reference, other)) / len(reference)


def agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    prefix_lens = [next((i for i, (a, b) in enumerate(zip(ref, out)) if a != b), len(ref))
                   for ref, out in zip(reference, other)]
    return {"identical": sum(n == len(r) for n, r in zip(prefix_lens, reference)) / len(reference),
            "mean_prefix_share": statistics.mean(n / len(r) for n, r in zip(prefix_lens, reference)),
            "num_prompts": len(reference)}


@torch.inference_mode()
def time_steps(runners: dict[str, ModelRunner], prompt: list[int], rounds: int, num_steps: int) -> dict:
    """Median ms of a prefill of `prompt` and of decode steps at batch 1 and BATCH, interleaved across runners."""
    samples = {name: {"prefill_ms": [], "decode_b1_ms": [], f"decode_b{BATCH}_ms": []} for name in runners}
    for _ in range(rounds):
        for name, runner in runners.items():
            for batch_size, key in ((1, "decode_b1_ms"), (BATCH, f"decode_b{BATCH}_ms")):
                n = blocks_per_seq(len(prompt) + num_steps + 1)
                reqs = [new_request(f"t{i}", prompt, 1 + i * n, len(prompt) + num_steps + 1) for i in range(batch_size)]
                started = time.perf_counter()
                runner.compute_logits(Batch([ScheduledSeq(r, 0, r.num_tokens) for r in reqs]))
                if batch_size == 1:
                    samples[name]["prefill_ms"].append((time.perf_counter() - started) * 1000)
                step_ms = []
                for step in range(num_steps):
                    for r in reqs:
                        r.num_computed_tokens = r.num_tokens
                        r.output_ids.append(EOS_ID + 1 + step)
                    started = time.perf_counter()
                    runner.compute_logits(Batch([ScheduledSeq(r, r.num_computed_tokens, 1) for r in reqs]))
                    step_ms.append((time.perf_counter() - started) * 1000)
                samples[name][key].append(statistics.median(step_ms))
    return {name: {k: statistics.median(v) for k, v in s.items()} for name, s in samples.items()}


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of every tensor the model holds: parameters, buffers and packed weights kept as attributes."""
    tensors = {}
    for module in model.modules():
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False),
                  *(v for v in vars(module).values() if isinstance(v, torch.Tensor))]:
            key = id(t) if t.is_mkldnn else t.data_ptr()  # oneDNN's packed weights have no data pointer
            tensors[key] = t.numel() * t.element_size()
    return sum(tensors.values())


def load_prompts(tokenizer: Tokenizer, text_ids: list[int], num_prompts: int, ppl_tokens: int) -> list[list[int]]:
    """Chat prompts through the model's template first, then 48-token excerpts of the text past the perplexity part."""
    from transformers import AutoTokenizer

    chat = AutoTokenizer.from_pretrained(ensure_bundled_model())
    lines = [json.loads(line)["prompt"] for line in CONVERSATIONS_PATH.read_text().splitlines() if line.strip()]
    prompts = [list(chat.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]) for m in lines]
    rest, excerpt_len = text_ids[ppl_tokens:], 48
    step = max(excerpt_len, (len(rest) - excerpt_len) // max(1, num_prompts - len(prompts)))
    prompts += [rest[i:i + excerpt_len] for i in range(0, len(rest) - excerpt_len, step)]
    if len(prompts) < num_prompts:
        raise ValueError(f"only {len(prompts)} prompts available, {num_prompts} asked")
    return prompts[:num_prompts]


def run(dtypes: list[str], sizes: dict, methods: tuple[str, ...] = ("int8",)) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        return run_in(dtypes, sizes, methods, Path(scratch))


def run_in(dtypes: list[str], sizes: dict, methods: tuple[str, ...], scratch: Path) -> dict:
    model_dir = ensure_bundled_model()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text_ids = tokenizer.encode(TEXT_PATH.read_text()).ids
    window, stride = sizes["window"], sizes["stride"]
    ppl_ids = text_ids[: sizes["ppl_tokens"]]
    windows = [ppl_ids[s:s + window] for s in range(0, len(ppl_ids) - window + 1, stride)]
    prompts = load_prompts(tokenizer, text_ids, sizes["num_prompts"], sizes["ppl_tokens"])
    timed_len = sizes["prefill_tokens"] + sizes["timed_steps"] + 1
    num_blocks = 1 + BATCH * blocks_per_seq(max(window, max(map(len, prompts)) + sizes["new_tokens"], timed_len))
    runners, rows, outputs, top1 = {}, [], {}, {}
    for dtype in dtypes:
        for quantization in ("none", *methods):
            name = f"{dtype}/{quantization}"
            started = time.perf_counter()
            # int4's layouts from floats (the bundled file's dequantized weights), not its Q4_1 blocks as they are
            group_size, symmetric = FROM_FLOATS.get(quantization, (32, False))
            folder = without_source(model_dir, scratch) if quantization in FROM_FLOATS else model_dir
            model = ModelConfig(model_dir=str(folder), block_size=BLOCK_SIZE, quantization=quantization.split("-")[0],
                                int4_group_size=group_size, int4_symmetric=symmetric, enforce_eager=True)
            runner = ModelRunner(model, dtype=getattr(torch, dtype), device="cpu", num_kv_blocks=num_blocks,
                                 eos_token_ids=[EOS_ID])
            nll_p, top1[f"{name}/prefill"] = nll_prefill(runner, windows, stride)
            nll_d, top1[f"{name}/decode"] = nll_decode(runner, windows, stride)
            n = len(windows) * stride
            outputs[name] = greedy(runner, prompts, sizes["new_tokens"])
            row = {"dtype": dtype, "quantization": quantization, "weight_bytes": weight_bytes(runner.model),
                   "ppl_prefill": math.exp(nll_p / n), "ppl_decode": math.exp(nll_d / n), "scored_tokens": n,
                   "quality_s": time.perf_counter() - started}
            if quantization != "none":
                row["greedy_vs_none"] = agreement(outputs[f"{dtype}/none"], outputs[name])
                row["top1_vs_none"] = {path: top1_agreement(top1[f"{dtype}/none/{path}"], top1[f"{name}/{path}"])
                                       for path in ("prefill", "decode")}
            rows.append(row)
            runners[name] = runner
            print(json.dumps(row), flush=True)
    yardstick = None
    if len(dtypes) == 2:
        yardstick = {**agreement(outputs["float32/none"], outputs["bfloat16/none"]),
                     "top1": {path: top1_agreement(top1[f"float32/none/{path}"], top1[f"bfloat16/none/{path}"])
                              for path in ("prefill", "decode")}}
    timings = time_steps(runners, text_ids[: sizes["prefill_tokens"]], sizes["rounds"], sizes["timed_steps"])
    for row in rows:
        row.update(timings[f"{row['dtype']}/{row['quantization']}"])
    return {"rows": rows, "greedy_bf16_vs_fp32": yardstick, "num_windows": len(windows),
            "num_prompts": len(prompts), "text_tokens": len(text_ids)}


def markdown(report: dict) -> str:
    p, m, res = report["params"], report["machine"], report["results"]
    quality, speed = [], []
    for r in res["rows"]:
        none = next(x for x in res["rows"] if x["dtype"] == r["dtype"] and x["quantization"] == "none")
        g, t = r.get("greedy_vs_none"), r.get("top1_vs_none")
        quality.append([r["dtype"], r["quantization"], f"{r['weight_bytes'] / 2**20:.0f}", f"{r['ppl_prefill']:.3f}",
                        f"{r['ppl_decode']:.3f}", f"{r['ppl_prefill'] / none['ppl_prefill']:.4f}x",
                        f"{r['ppl_decode'] / none['ppl_decode']:.4f}x",
                        f"{t['prefill']:.1%} / {t['decode']:.1%}" if t else "–",
                        f"{g['identical']:.0%}" if g else "–", f"{g['mean_prefix_share']:.0%}" if g else "–"])
        speed.append([r["dtype"], r["quantization"], f"{r['prefill_ms']:.0f}", f"{r['decode_b1_ms']:.1f}",
                      f"{r[f'decode_b{BATCH}_ms']:.1f}", f"{r['prefill_ms'] / none['prefill_ms']:.2f}x",
                      f"{r['decode_b1_ms'] / none['decode_b1_ms']:.2f}x",
                      f"{r[f'decode_b{BATCH}_ms'] / none[f'decode_b{BATCH}_ms']:.2f}x"])
    y = res["greedy_bf16_vs_fp32"]
    return "\n".join([
        f"# --quantization {', '.join(p.get('methods', ['int8']))}: quality and speed on the bundled model "
        "(SmolLM2-135M-Instruct)", "",
        f"`{report['command']}` on {report['date']}: {m.get('cpu_model')} ({' '.join(m.get('cpu_flags', []))}), "
        f"{p['torch_threads']} torch threads, torch {m.get('torch')}.", "",
        f"Perplexity over {res['rows'][0]['scored_tokens']} tokens of bench/data/opticks.txt ({res['num_windows']} "
        f"windows of {p['window']} tokens, stride {p['stride']}): `prefill` runs each window as one prompt (int8, "
        f"int4: dequantized weights), `decode` feeds the scored tokens one step at a time, {BATCH} windows a step "
        f"(int8, int4: their GEMV kernels). Greedy: {res['num_prompts']} prompts x {p['new_tokens']} tokens against the same dtype "
        "unquantized; `identical`: prompts whose tokens all match; `prefix`: mean share of tokens before the first "
        "divergence. top-1: the share of scored text positions where the model's most likely next token is the "
        "unquantized model's (teacher-forced, so one flip does not carry over).", "",
        table(["dtype", "quantization", "weights MiB", "ppl prefill", "ppl decode", "ppl prefill / none",
               "ppl decode / none", "top-1 = none's (prefill / decode)", "greedy identical", "greedy prefix"],
              quality), "",
        (f"Yardstick, bfloat16 against float32 (both unquantized): top-1 {y['top1']['prefill']:.1%} / "
         f"{y['top1']['decode']:.1%}, greedy {y['identical']:.0%} identical, {y['mean_prefix_share']:.0%} prefix."
         if y else ""), "",
        f"## Speed (ms, medians of {p['rounds']} interleaved rounds)", "",
        table(["dtype", "quantization", f"prefill {p['prefill_tokens']} tokens", "decode step, batch 1",
               f"decode step, batch {BATCH}", "prefill / none", "decode b1 / none", f"decode b{BATCH} / none"], speed),
        ""])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.quant_quality", description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--methods", default="int8,int4", help="quantization methods against none, comma-separated; "
                    "int4 from the dequantized floats rather than the file's blocks too: " + ", ".join(FROM_FLOATS))
    for key, value in FULL.items():
        ap.add_argument(f"--{key.replace('_', '-')}", type=int, default=None, help=f"default {value}")
    ap.add_argument("--quick", action="store_true", help="a few tokens and prompts: checks that it runs")
    ap.add_argument("--num-threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/quant_quality-cpu.json"))
    args = ap.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    sizes = {k: getattr(args, k) or v for k, v in (QUICK if args.quick else FULL).items()}
    methods = tuple(args.methods.split(","))
    results = run(args.dtypes.split(","), sizes, methods)
    report = {"benchmark": "quant_quality", **provenance("rill.bench.kernels.quant_quality", argv, None),
              "params": {**sizes, "dtypes": args.dtypes.split(","), "methods": list(methods), "quick": args.quick,
                         "torch_threads": torch.get_num_threads()},
              "results": results}
    text = markdown(report)
    save_results(args.out, report, text)
    print(text)
    return report


if __name__ == "__main__":
    main()
