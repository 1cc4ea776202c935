"""PNG plots for bench reports: latency percentiles per server, output throughput against the varied setting."""
from __future__ import annotations

import math
from pathlib import Path

# Figure with its Agg canvas, never pyplot: no display, no global backend switch, nothing left open.
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

PERCENTILES = [("p50", "median"), ("p90", "p90"), ("p99", "p99")]  # (label, result field prefix)
LATENCIES = [("ttft", "TTFT: time to first token"), ("itl", "ITL: inter-token latency")]
AXIS_LABELS = {"max_concurrency": "max concurrency (requests in flight)", "request_rate": "request rate (req/s)"}
AXIS_WORDS = {"max_concurrency": "concurrency", "request_rate": "request rate"}
LINESTYLES = {"p50": "-", "p90": "--", "p99": ":"}
DPI = 120


def _setting_text(setting) -> str:
    return "inf" if math.isinf(setting) else f"{setting:g}"


def _positions(settings: list) -> list[float]:
    # An unlimited rate has no place on a log axis: draw it one doubling past the largest finite one.
    finite = [s for s in settings if not math.isinf(s)]
    beyond = 2 * max(finite) if finite else 1.0
    return [beyond if math.isinf(s) else float(s) for s in settings]


def _rows(doc: dict) -> dict:
    return {(row["label"], row["setting"]): row for row in doc["aggregate"]}


def _labels(doc: dict) -> list[str]:
    return [server["label"] for server in doc["servers"]]


def _median(rows: dict, label: str, setting, field: str) -> float:
    value = rows[label, setting]["median"].get(field)
    return math.nan if value is None else value


def _setting_axis(ax, doc: dict) -> None:
    positions = _positions(doc["settings"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(positions, labels=[_setting_text(s) for s in doc["settings"]])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(AXIS_LABELS[doc["axis"]])
    if len(positions) == 1:  # one point: give it some room instead of a zero-width axis
        ax.set_xlim(positions[0] / 2, positions[0] * 2)


def _rounds_note(doc: dict) -> str:
    return f"median of {doc['num_rounds']} round{'s' if doc['num_rounds'] != 1 else ''}"


def plot_throughput(doc: dict, path: Path) -> None:
    """Output tok/s against the varied setting, one line per server; bars span min to max over rounds."""
    rows, settings = _rows(doc), doc["settings"]
    fig = Figure(figsize=(8, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    positions = _positions(settings)
    labels = _labels(doc)
    for i, label in enumerate(labels):
        # Nudge each server sideways a little so that equal points and their bars do not hide each other.
        nudged = [x * 2 ** ((i - (len(labels) - 1) / 2) * 0.03) for x in positions]
        medians = [_median(rows, label, s, "output_throughput") for s in settings]
        low = [rows[label, s]["min"].get("output_throughput", math.nan) for s in settings]
        high = [rows[label, s]["max"].get("output_throughput", math.nan) for s in settings]
        errors = [[max(m - lo, 0) for m, lo in zip(medians, low)], [max(hi - m, 0) for m, hi in zip(medians, high)]]
        ax.errorbar(nudged, medians, yerr=errors if doc["num_rounds"] > 1 else None, marker="o", capsize=4,
                    label=label + (" (baseline)" if label == doc["baseline"] and doc["kind"] == "compare" else ""))
    _setting_axis(ax, doc)
    ax.set_ylabel("output throughput (tokens/s), higher is better")
    ax.set_ylim(bottom=0)
    spread = ", bars: min–max" if doc["num_rounds"] > 1 else ""
    ax.set_title(f"Output throughput vs {AXIS_WORDS[doc['axis']]} ({_rounds_note(doc)}{spread})")
    ax.grid(True, alpha=0.3)
    ax.legend(title="server")
    fig.savefig(path, dpi=DPI)


def plot_latency(doc: dict, path: Path) -> None:
    """p50/p90/p99 of TTFT and ITL: lines against the setting for one server, grouped bars for several."""
    if len(doc["servers"]) == 1:
        _latency_lines(doc, path)
    else:
        _latency_bars(doc, path)


def _latency_lines(doc: dict, path: Path) -> None:
    rows, settings, (label,) = _rows(doc), doc["settings"], _labels(doc)
    fig = Figure(figsize=(11, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    for col, (metric, title) in enumerate(LATENCIES):
        ax = fig.add_subplot(1, len(LATENCIES), col + 1)
        spread = []
        for name, prefix in PERCENTILES:
            values = [_median(rows, label, s, f"{prefix}_{metric}_ms") for s in settings]
            ax.plot(_positions(settings), values, marker="o", linestyle=LINESTYLES[name], label=name)
            spread.extend(v for v in values if v > 0)
        _setting_axis(ax, doc)
        # Latency often grows 100x from concurrency 1 to 64: a linear axis would flatten the low end.
        log_y = bool(spread) and max(spread) > 20 * min(spread)
        if log_y:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # labels at 100, 200, 500, 1000...
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))  # 2000, not 2×10³
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel(f"{metric.upper()} (ms{', log scale' if log_y else ''}), lower is better")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(title="percentile")
    fig.suptitle(f"Latency percentiles of {label} ({_rounds_note(doc)})")
    fig.savefig(path, dpi=DPI)


def _latency_bars(doc: dict, path: Path) -> None:
    rows, settings, labels = _rows(doc), doc["settings"], _labels(doc)
    width = 0.8 / len(labels)
    fig = Figure(figsize=(11, 1.2 + 3.2 * len(settings)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(settings), len(LATENCIES), squeeze=False)
    for row_axes, setting in zip(axes, settings):
        for ax, (metric, title) in zip(row_axes, LATENCIES):
            for i, label in enumerate(labels):
                values = [_median(rows, label, setting, f"{prefix}_{metric}_ms") for _, prefix in PERCENTILES]
                xs = [x + (i - (len(labels) - 1) / 2) * width for x in range(len(PERCENTILES))]
                bars = ax.bar(xs, values, width, label=label, color=f"C{i}")
                ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=1)
            ax.set_xticks(range(len(PERCENTILES)), labels=[name for name, _ in PERCENTILES])
            ax.set_ylabel(f"{metric.upper()} (ms), lower is better")
            ax.set_title(f"{title} — {AXIS_WORDS[doc['axis']]} {_setting_text(setting)}")
            ax.margins(y=0.15)  # room for the value labels above the bars
            ax.grid(True, axis="y", alpha=0.3)
    handles, names = axes[0][0].get_legend_handles_labels()
    names = [n + (" (baseline)" if n == doc["baseline"] else "") for n in names]
    # The legend doubles as the figure's title: a suptitle would collide with it.
    fig.legend(handles, names, title=f"Latency percentiles per server ({_rounds_note(doc)})",
               loc="outside upper center", ncols=min(len(labels), 6))
    fig.savefig(path, dpi=DPI)
