"""`bench.peers --shape DIR`: the peers at a real model's shape with random weights (issue 33, item 4).

The served sides load a model directory made for the config (bench/kernels/dummy_model_dir.py) with
`--load-format dummy`; llama.cpp serves a Q4_0 GGUF of the same shape (bench/peers/shape_gguf.py); both
are made once under the bench cache. Besides the ratios, a run at a shape records:
- the bandwidth floor of Rill int4's decode: the bytes one decode token reads (every layer's 4-bit linears,
  the int8 head) over the bandwidth a large copy measures in the same run;
- the same for bfloat16 weights (what Rill and vLLM read at their defaults), over the bandwidth a large read
  measures: where the two ITLs sit against the floor, and so whether the ITL goal against vLLM is reachable;
- each side's resident memory once the rounds are done (its process tree), and Rill's engine against
  the weights as stored (the checkpoint's parameters in bfloat16) plus its KV cache;
- each side's start time, launch to ready.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from rill.bench.kernels.dummy_model_dir import make_dir
from rill.bench.kernels.int4_linears import copy_bandwidth, weight_bytes
from rill.bench.peers import shape_gguf
from rill.bench.peers.report import TARGETS
from rill.bench.serving.markdown import number, table
from rill.engine_proc.model.bundled import default_cache_dir, ensure_bundled_model

MEMORY_TARGET = (1.2, 300e6)  # engine RSS <= 1.2 x (weights as stored + KV cache) + 300 MB
FLOOR_TARGET = 1.3  # Rill int4's median ITL at concurrency 1 <= 1.3 x its bandwidth floor
RILL_SIDES = ("rill", "rill_int8", "rill_int4")


@dataclass(frozen=True)
class Shape:
    config_dir: Path
    model_dir: Path  # config.json and a padded tokenizer: served with --load-format dummy
    tokenizer_dir: Path  # the tokenizer alone: vLLM's --tokenizer (see prepare)
    gguf: Path | None  # the same shape in Q4_0, for llama.cpp (None: not asked for)
    config: dict

    @property
    def name(self) -> str:
        return self.config_dir.name


def prepare(config_dir: Path, with_gguf: bool, log=print) -> Shape:
    """The model directory (written afresh) and, if asked, the GGUF (written once per config: its name
    carries the config's hash)."""
    config_dir = config_dir.resolve()
    text = (config_dir / "config.json").read_text()
    root = default_cache_dir() / "bench" / "shapes"
    model_dir = make_dir(config_dir, root / config_dir.name, ensure_bundled_model())
    # transformers' AutoTokenizer, as vLLM loads it, picks the tokenizer class of the config's model type
    # (Qwen2's own pre-tokenizer for a qwen2 config: 4,113 tokens for the 4,096 of the prompts); without a
    # config.json beside it, it reads tokenizer.json as it is, as Rill and llama.cpp do.
    tokenizer_dir = root / f"{config_dir.name}-tokenizer"
    tokenizer_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(model_dir / name, tokenizer_dir / name)
    gguf = root / f"{config_dir.name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}-Q4_0.gguf" if with_gguf else None
    if gguf is not None and not gguf.is_file():
        log(f"writing {gguf} (random weights, once)")
        shape_gguf.write(config_dir, gguf)
    return Shape(config_dir, model_dir, tokenizer_dir, gguf, json.loads(text))


def num_parameters(config: dict) -> int:
    """The checkpoint's parameters (a tied head once), counted on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    return sum(p.numel() for p in model.parameters())


def int4_decode_bytes(config: dict, symmetric: bool = True) -> int:
    """Bytes Rill int4 reads per decode token: each layer's 4-bit linears (fused q/k/v, o, fused gate/up,
    down; symmetric, as the rill_int4 side serves them: sides.py), then the int8 head
    (engine_proc/kernels/quantization.py); the embedding reads one row."""
    from rill.engine_proc.kernels.int4_linear import Int4Linear
    from rill.engine_proc.kernels.int8_linear import Int8Linear

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes = [((heads + 2 * kv_heads) * head_dim, hidden), (hidden, heads * head_dim), (2 * inter, hidden),
              (hidden, inter)]
    layer = sum(weight_bytes(Int4Linear(torch.zeros(n, k, dtype=torch.bfloat16), symmetric=symmetric))
                for n, k in shapes)
    head = weight_bytes(Int8Linear(torch.zeros(config["vocab_size"], hidden, dtype=torch.bfloat16)))
    return config["num_hidden_layers"] * layer + head


def bf16_decode_bytes(config: dict) -> int:
    """Bytes a bfloat16 decode token reads: every weight once but the embedding's (one row), whose matrix a tied
    head reads in its place."""
    untied = 0 if config.get("tie_word_embeddings") else config["vocab_size"] * config["hidden_size"]
    return 2 * (num_parameters(config) - untied)


def read_bandwidth(num_bytes: int = 1 << 30) -> float:
    """Bytes read per second by torch's sum of a large buffer's 64-bit words (the best of 5): above the copy's
    figure, which counts what a copy reads and writes while the two compete."""
    src = torch.ones(num_bytes // 8, dtype=torch.int64)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        src.sum()
        best = min(best, time.perf_counter() - start)
    return num_bytes / best


def bandwidth_figures(config: dict) -> dict:
    bandwidth, read = copy_bandwidth(1 << 30), read_bandwidth(1 << 30)
    step_bytes, bf16_bytes = int4_decode_bytes(config), bf16_decode_bytes(config)
    return {"copy_bandwidth_gb_s": bandwidth / 1e9, "int4_decode_bytes": step_bytes,
            "int4_floor_ms": step_bytes / bandwidth * 1e3, "read_bandwidth_gb_s": read / 1e9,
            "bf16_decode_bytes": bf16_bytes, "bf16_floor_ms": bf16_bytes / read * 1e3}


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants (Linux /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, StopIteration):
            continue
    return total


def memory_figures(servers: dict, num_params: int) -> dict:
    """Per served side: its process tree's RSS; for Rill, its engine's own figures from /stats."""
    out = {}
    for side, server in servers.items():
        row = {"tree_rss_bytes": tree_rss(server.proc.pid)}
        if side in RILL_SIDES:
            stats = httpx.get(f"{server.base_url}/stats", timeout=30).json()
            row |= {k: stats[k] for k in ("rss_bytes", "peak_rss_bytes", "weight_bytes", "kv_cache_bytes", "dtype")}
            stored = num_params * 2  # the checkpoint in bfloat16, as Qwen2.5's is published
            row["stored_weight_bytes"] = stored
            row["limit_bytes"] = MEMORY_TARGET[0] * (stored + stats["kv_cache_bytes"]) + MEMORY_TARGET[1]
        out[side] = row
    return out


def markdown(shape_report: dict, rounds_itl_ms: float | None, itls_ms: dict[str, float] | None = None) -> list[str]:
    """The shape's own section: the floors, memory and start times. rounds_itl_ms: Rill int4's median ITL at
    concurrency 1; itls_ms: Rill's and vLLM's, where measured."""
    s = shape_report
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    gguf = (f"; llama.cpp: `{Path(s['gguf']).name}`, every 2-D weight Q4_0, the embedding and tied head Q8_0"
            if s["gguf"] else "")
    lines = [f"## At {s['name']}'s shape", "",
             f"- {s['num_parameters'] / 1e9:.2f} B parameters; random weights (`--load-format dummy`{gguf})",
             f"- a 1 GiB copy moved {s['copy_bandwidth_gb_s']:.1f} GB/s (read + written); Rill int4 reads "
             f"{s['int4_decode_bytes'] / 1e6:.0f} MB a decode token: a floor of {s['int4_floor_ms']:.1f} ms"]
    if rounds_itl_ms is not None:
        ratio = rounds_itl_ms / s["int4_floor_ms"]
        lines.append(f"- Rill int4's median ITL at concurrency 1: {rounds_itl_ms:.1f} ms, {ratio:.2f}x the floor "
                     f"(target <= {FLOOR_TARGET}x): {'PASS' if ratio <= FLOOR_TARGET else 'FAIL'}")
    if "bf16_floor_ms" in s:
        lines.append(f"- a 1 GiB read (torch's sum) ran at {s['read_bandwidth_gb_s']:.1f} GB/s; bfloat16 weights read "
                     f"{s['bf16_decode_bytes'] / 1e6:.0f} MB a decode token: a floor of {s['bf16_floor_ms']:.1f} ms")
        itls = itls_ms or {}
        if "rill" in itls and "vllm" in itls:
            floor, goal = s["bf16_floor_ms"], TARGETS["vllm_itl"].target
            lines.append(f"- against that floor Rill's ITL at concurrency 1 is {itls['rill'] / floor:.2f}x and vLLM's "
                         f"{itls['vllm'] / floor:.2f}x: the goal of {goal}x vLLM's asks Rill for "
                         f"{goal * itls['vllm'] / floor:.2f}x" + (" (below the floor: out of reach in this run)"
                                                                  if goal * itls["vllm"] < floor else ""))
    rows = []
    for side, m in s["memory"].items():
        engine = [gib(m["rss_bytes"]), gib(m["peak_rss_bytes"]), gib(m["weight_bytes"]), gib(m["kv_cache_bytes"]),
                  f"{gib(m['limit_bytes'])}: {'PASS' if m['rss_bytes'] <= m['limit_bytes'] else 'FAIL'}"] \
            if "rss_bytes" in m else ["–"] * 5
        rows.append([side, gib(m["tree_rss_bytes"]), *engine, number(s["startup_s"].get(side, float("nan")))])
    lines += ["", table(["side", "processes' RSS", "engine RSS", "engine peak RSS", "weights as loaded", "KV cache",
                         f"limit {MEMORY_TARGET[0]}x(bf16 checkpoint + KV) + 300 MB", "start s"], rows)]
    return lines
