"""report.md for `rill bench compare` and `rill bench sweep`: provenance, metric tables, ratios to a baseline."""
from __future__ import annotations

import math
import os
import platform
import shlex
import sys
from collections import Counter
from pathlib import Path

# (result field, column header); the arrow says which way is better.
KEY_METRICS = [
    ("output_throughput", "output tok/s ↑"),
    ("request_throughput", "req/s ↑"),
    ("mean_ttft_ms", "mean TTFT ms ↓"),
    ("median_ttft_ms", "median TTFT ms ↓"),
    ("p99_ttft_ms", "p99 TTFT ms ↓"),
    ("mean_tpot_ms", "mean TPOT ms ↓"),
    ("mean_itl_ms", "mean ITL ms ↓"),
    ("p99_itl_ms", "p99 ITL ms ↓"),
    ("p99_e2el_ms", "p99 E2EL ms ↓"),
]
# The few columns the summary shows for each non-baseline server.
SUMMARY_METRICS = ["output_throughput", "median_ttft_ms", "mean_tpot_ms", "p99_e2el_ms"]
AXIS_TITLES = {"max_concurrency": "max concurrency", "request_rate": "request rate (req/s)"}
HOW_TO_READ = ("Ratios are each server's median divided by the baseline's at the same setting "
               "(1.25× = a quarter more than the baseline). ↑ higher is better (throughput): "
               "above 1× the server beats the baseline. ↓ lower is better (latency): "
               "below 1× the server beats the baseline.")


def machine_info() -> dict:
    return {"hostname": platform.node(), "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "platform": platform.platform(), "python": platform.python_version(),
            "load_avg_1m_start": os.getloadavg()[0]}


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed, with an --api-key value hidden: reports get shared."""
    argv = list(sys.argv if argv is None else argv)
    prog = Path(argv[0]).name if argv else "rill"
    if prog == "__main__.py":
        parts = Path(argv[0]).parent.parts  # .../bench[/peers]/__main__.py, installed as rill.bench[.peers]
        package = parts[len(parts) - parts[::-1].index("bench") - 1:] if "bench" in parts else parts[-1:]
        prog = "python -m rill." + ".".join(package)
    words = argv[1:]
    for i, word in enumerate(words):
        if word == "--api-key" and i + 1 < len(words):
            words[i + 1] = "***"
        elif word.startswith("--api-key="):
            words[i] = "--api-key=***"
    return f"{prog} {shlex.join(words)}".strip()


def number(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, str):
        return value
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def times(ratio) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"


def setting_text(setting) -> str:
    return "inf" if isinstance(setting, float) and math.isinf(setting) else f"{setting:g}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|")


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(map(_cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _counts(row: dict) -> str:
    median = row["median"]
    if not row["num_rounds"]:
        return "no run finished"
    # A median over an even number of rounds can be x.5, hence :g rather than int().
    return " / ".join("–" if median.get(key) is None else f"{median[key]:g}" for key in ("completed", "failed"))


def _spread(row: dict) -> str:
    low, high = row["min"].get("output_throughput"), row["max"].get("output_throughput")
    return "–" if low is None else f"{number(low)}–{number(high)}"


def _held(name: str, value) -> str:
    if value is None or value == "inf" or (isinstance(value, float) and math.isinf(value)):
        return "unlimited (every request sent at once)" if name == "request_rate" else "unlimited"
    return setting_text(value)


def header(doc: dict, title: str) -> str:
    cfg, machine = doc.get("config", {}), doc.get("machine", {})
    lengths = (f"input {cfg.get('random_input_len')} / output {cfg.get('random_output_len')} tokens"
               if cfg.get("dataset_name") == "random"
               else f"output {cfg['conversations_output_len']} tokens" if cfg.get("conversations_output_len")
               else "each prompt's own output length")
    workload = (f"{cfg.get('num_prompts')} prompts from `{cfg.get('dataset_name')}`, {lengths}, "
                f"seed {cfg.get('seed')}, endpoint `{cfg.get('endpoint')}`")
    fixed = ", ".join(f"{AXIS_TITLES.get(k, k)} held at {_held(k, v)}" for k, v in doc.get("fixed", {}).items())
    end_load = machine.get("load_avg_1m_end")
    lines = [
        f"# {title}", "",
        f"- **Date:** {doc.get('date')}",
        f"- **Machine:** {machine.get('hostname')}, {machine.get('cpu_count')} CPUs "
        f"({machine.get('cpus_usable')} usable), {machine.get('platform')}, Python {machine.get('python')}; "
        f"1-min load average {number(machine.get('load_avg_1m_start'))} at start"
        + (f", {number(end_load)} at end" if end_load is not None else ""),
        f"- **Workload:** {workload}; the same prompts for every server and run",
        f"- **Varied:** {AXIS_TITLES[doc['axis']]} over {', '.join(map(setting_text, doc['settings']))}"
        + (f"; {fixed}" if fixed else ""),
        f"- **Rounds:** {doc['num_rounds']}; each round runs every setting"
        + (", the servers in an order rotated each round" if len(doc["servers"]) > 1 else "")
        + "; the numbers are medians over rounds",
        "", "Command:", "", "```", doc.get("command", ""), "```", "",
    ]
    if not doc.get("complete", True):
        lines += ["> **Incomplete:** interrupted before every run finished.", ""]
    errors = [run for run in doc.get("runs", []) if "error" in run]
    if errors:
        lines += ["> **Runs that failed:**"]
        lines += [f"> - round {r['round'] + 1}, {AXIS_TITLES[doc['axis']]} {setting_text(r['setting'])}, "
                  f"{r['label']}: {r['error']}"
                  for r in errors] + [""]
    request_errors = Counter()
    for run in doc.get("runs", []):
        request_errors.update((run.get("result") or {}).get("error_counts") or {})
    if request_errors:
        lines += ["> **Failed requests, by error (all runs):**"]
        lines += [f"> - {count} × {message[:200]}" for message, count in request_errors.most_common(5)] + [""]
    return "\n".join(lines) + "\n"


def _plots(plot_names: list[str]) -> str:
    return "".join(f"![{Path(name).stem}]({name})\n\n" for name in plot_names)


def compare_report(doc: dict, plot_names: list[str] = ()) -> str:
    labels = [server["label"] for server in doc["servers"]]
    baseline = doc["baseline"]
    others = [label for label in labels if label != baseline]
    rows = {(row["label"], row["setting"]): row for row in doc["aggregate"]}
    ratio = {(row["label"], row["setting"]): row["ratio"] for row in doc["ratios"]}
    axis = AXIS_TITLES[doc["axis"]]
    parts = [header(doc, f"rill bench compare: {' vs '.join(labels)}")]
    parts.append(table(["server", "URL", "model"],
                       [[s["label"] + (" (baseline)" if s["label"] == baseline else ""), s["base_url"], s["model"]]
                        for s in doc["servers"]]))
    if others:
        names = dict(KEY_METRICS)
        parts.append(f"\n## Summary: ratio to baseline `{baseline}`\n\n{HOW_TO_READ}\n\n")
        parts.append(table([axis] + [f"{label}: {names[m]}" for label in others for m in SUMMARY_METRICS],
                           [[setting_text(s)] + [times(ratio[label, s].get(m)) for label in others
                                                 for m in SUMMARY_METRICS] for s in doc["settings"]]))
    spread = doc["num_rounds"] > 1
    for setting in doc["settings"]:
        parts.append(f"\n## {axis} {setting_text(setting)}\n\n")
        parts.append(table(
            ["server", "completed / failed"] + [name for _, name in KEY_METRICS]
            + (["output tok/s min–max"] if spread else []),
            [[label + (" (baseline)" if label == baseline else ""), _counts(rows[label, setting])]
             + [number(rows[label, setting]["median"].get(m)) for m, _ in KEY_METRICS]
             + ([_spread(rows[label, setting])] if spread else []) for label in labels]))
        if others:
            parts.append(f"\nRatio to baseline `{baseline}` (↑ higher is better, ↓ lower is better):\n\n")
            parts.append(table(["server"] + [name for _, name in KEY_METRICS],
                               [[label] + [times(ratio[label, setting].get(m)) for m, _ in KEY_METRICS]
                                for label in others]))
    parts.append("\n## Plots\n\n" + _plots(plot_names))
    return "".join(parts)


def sweep_report(doc: dict, plot_names: list[str] = ()) -> str:
    server = doc["servers"][0]
    rows = {row["setting"]: row for row in doc["aggregate"]}
    spread = doc["num_rounds"] > 1
    parts = [header(doc, f"rill bench sweep: {server['label']}"),
             f"Server: `{server['base_url']}`, model `{server['model']}`\n\n## Results\n\n"]
    parts.append(table(
        [AXIS_TITLES[doc["axis"]], "completed / failed"] + [name for _, name in KEY_METRICS]
        + (["output tok/s min–max"] if spread else []),
        [[setting_text(s), _counts(rows[s])] + [number(rows[s]["median"].get(m)) for m, _ in KEY_METRICS]
         + ([_spread(rows[s])] if spread else []) for s in doc["settings"]]))
    parts.append("\n## Plots\n\n" + _plots(plot_names))
    return "".join(parts)


def report(doc: dict, plot_names: list[str] = ()) -> str:
    return (compare_report if doc["kind"] == "compare" else sweep_report)(doc, plot_names)
