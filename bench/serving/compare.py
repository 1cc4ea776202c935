"""`rill bench compare`: one workload against several servers, interleaved round by round."""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime
import json
import math
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

from rill.bench.serving import markdown
from rill.bench.serving.axis import Axis, add_axis_args, base_config, resolve_axis, serve_module

DEFAULT_CONCURRENCY = [1, 8, 32]
# Ratios are only taken for metrics with a "better" direction; counts like `completed` have none.
_HIGHER_IS_BETTER = ("throughput", "goodput")
# Per-request lists in a run's result: thousands of numbers each, left out of the JSON unless asked for.
PER_REQUEST_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "errors")


@dataclasses.dataclass(frozen=True)
class Server:
    label: str
    base_url: str | None  # None: keep the base config's (a sweep's own --base-url)
    model: str | None = None  # None: the base config's --model


def parse_server(text: str) -> Server:
    """'LABEL=URL' or 'LABEL=URL@MODEL' (the model follows the last '@')."""
    label, sep, rest = text.partition("=")
    url, at, model = rest.rpartition("@") if "@" in rest else (rest, "", "")
    if not sep or not label.strip() or not url.strip() or (at and not model.strip()):
        raise argparse.ArgumentTypeError(f"not LABEL=URL or LABEL=URL@MODEL: {text!r}")
    return Server(label.strip(), url.strip().rstrip("/"), model.strip() or None)


def add_compare_args(parser: argparse.ArgumentParser) -> None:
    add_axis_args(parser, DEFAULT_CONCURRENCY, default_rounds=3)
    group = parser.add_argument_group("compare")
    group.add_argument("--server", type=parse_server, action="append", required=True, default=argparse.SUPPRESS,
                       metavar="LABEL=URL[@MODEL]",
                       help="a server to compare (repeat); @MODEL when its model id differs from --model")
    group.add_argument("--baseline", default=None, help="the label ratios are taken against; unset: the first --server")


def rotated(servers: list, round_idx: int) -> list:
    """Round r starts with server r (mod n): no server always runs first, or always after another."""
    shift = round_idx % len(servers)
    return servers[shift:] + servers[:shift]


async def run_rounds(base_cfg, servers: list[Server], axis: Axis, num_rounds: int, prompts, run_benchmark,
                     runs: list[dict], cooldown_s: float = 0.0, on_run=None) -> list[dict]:
    """Every server x setting x round once: rounds outermost so machine drift hits all servers alike.

    Appends to `runs` as it goes, so an interrupted comparison keeps what it measured.
    A run that raises is recorded with its error; the others go on.
    """
    field_names = {field.name for field in dataclasses.fields(base_cfg)}
    for round_idx in range(num_rounds):
        for setting in axis.values:
            for position, server in enumerate(rotated(servers, round_idx)):
                changes = {axis.name: setting, "model": server.model or base_cfg.model}
                if server.base_url is not None:
                    changes["base_url"] = server.base_url
                if "label" in field_names:  # the result then says which server it measured
                    changes["label"] = server.label
                run = {"round": round_idx, "position": position, "label": server.label, "setting": setting}
                try:
                    run["result"] = await run_benchmark(dataclasses.replace(base_cfg, **changes), prompts)
                except Exception as exc:  # one dead server must not lose the others' numbers
                    run["error"] = f"{type(exc).__name__}: {exc}"
                runs.append(run)
                if on_run is not None:
                    on_run(run)
                if cooldown_s > 0:
                    await asyncio.sleep(cooldown_s)
    return runs


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def aggregate(runs: list[dict], labels: list[str], settings: list) -> list[dict]:
    """Per server and setting: the median, min and max over rounds of every numeric metric."""
    rows = []
    for setting in settings:
        for label in labels:
            results = [r["result"] for r in runs
                       if r["label"] == label and r["setting"] == setting and r.get("result")]
            row = {"label": label, "setting": setting, "num_rounds": len(results),
                   "median": {}, "min": {}, "max": {}}
            for key in dict.fromkeys(k for result in results for k in result):
                values = [result[key] for result in results if _is_number(result.get(key))]
                if values:
                    row["median"][key] = statistics.median(values)
                    row["min"][key], row["max"][key] = min(values), max(values)
            rows.append(row)
    return rows


def better_when(metric: str) -> str | None:
    """'higher', 'lower', or None for metrics that are neither (counts, settings)."""
    if any(word in metric for word in _HIGHER_IS_BETTER):
        return "higher"
    if metric.endswith("_ms") or metric == "duration":
        return "lower"
    return None


def ratios(rows: list[dict], baseline: str) -> list[dict]:
    """Each server's median over the baseline's, same setting: 1.25 means 1.25x the baseline's value."""
    base = {row["setting"]: row["median"] for row in rows if row["label"] == baseline}
    out = []
    for row in rows:
        reference = base.get(row["setting"], {})
        values = {}
        for metric, value in row["median"].items():
            if better_when(metric) and _is_number(reference.get(metric)) and reference[metric] != 0:
                values[metric] = value / reference[metric]
        out.append({"label": row["label"], "setting": row["setting"], "baseline": baseline, "ratio": values})
    return out


def slim(result: dict) -> dict:
    """A run's result without its per-request lists; the request errors counted by message instead."""
    kept = {key: value for key, value in result.items() if key not in PER_REQUEST_FIELDS}
    kept["error_counts"] = dict(Counter(error for error in result.get("errors") or [] if error))
    return kept


def _jsonable(value):
    # JSON has no Infinity: an unlimited request rate is written "inf", as vllm bench serve does.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(item) for item in value]
    return value


def write_json(path: Path, doc: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(doc), indent=2, default=str) + "\n")
    tmp.replace(path)  # a reader never sees half a file, even after Ctrl-C


def write_outputs(out_dir: Path, doc: dict) -> list[Path]:
    """<kind>.json, report.md, latency.png and throughput.png in out_dir."""
    from rill.bench.serving import plots  # matplotlib loads only when a report is written, not on every `rill`

    paths = [out_dir / f"{doc['kind']}.json", out_dir / "report.md", out_dir / "latency.png",
             out_dir / "throughput.png"]
    write_json(paths[0], doc)
    plots.plot_latency(doc, paths[2])
    plots.plot_throughput(doc, paths[3])
    paths[1].write_text(markdown.report(doc, plot_names=[p.name for p in paths[2:]]))
    return paths


def _log_run(run: dict, axis_name: str) -> None:
    where = f"round {run['round'] + 1}, {axis_name} {run['setting']:g}, {run['label']}"
    if "error" in run:
        print(f"[{where}] error: {run['error']}", file=sys.stderr)
        return
    result = run["result"]
    print(f"[{where}] {result.get('completed')} completed, {result.get('failed')} failed, "
          f"{result.get('output_throughput', 0):.1f} output tok/s, "
          f"median TTFT {result.get('median_ttft_ms', 0):.1f} ms", file=sys.stderr)


def execute(kind: str, args: argparse.Namespace, servers: list[Server], axis: Axis, baseline: str) -> int:
    """Build the prompts once, run the rounds, write the report folder; 0 if every run completed requests."""
    serve, num_rounds = serve_module(), args.rounds
    try:
        cfg = base_config(args, axis)
        prompts = serve.build_prompts(cfg)
    except (ValueError, OSError) as exc:  # a malformed flag, a missing tokenizer or dataset file
        print(f"rill bench {kind}: error: {exc}", file=sys.stderr)
        return 2
    now = datetime.datetime.now().astimezone()
    out_dir = args.out or Path("bench/results") / f"{kind}-{now:%Y%m%d-%H%M%S}"
    doc = {"kind": kind, "command": markdown.command_line(), "date": now.isoformat(timespec="seconds"),
           "machine": markdown.machine_info(), "config": dataclasses.asdict(cfg), "axis": axis.name,
           "settings": axis.values, "fixed": axis.fixed, "baseline": baseline, "num_rounds": num_rounds,
           "servers": [{"label": s.label, "base_url": s.base_url or cfg.base_url, "model": s.model or cfg.model}
                       for s in servers],
           "complete": False, "runs": []}
    if doc["config"].get("api_key"):
        doc["config"]["api_key"] = "***"

    def on_run(run: dict) -> None:
        if "result" in run and not args.keep_per_request:
            run["result"] = slim(run["result"])
        _log_run(run, axis.name)
        write_json(out_dir / f"{kind}.json", doc)  # so far: an interrupted run keeps what it measured

    try:
        asyncio.run(run_rounds(cfg, servers, axis, num_rounds, prompts, serve.run_benchmark, doc["runs"],
                               args.cooldown_s, on_run))
        doc["complete"] = True
    except KeyboardInterrupt:
        print("interrupted: reporting the runs that finished", file=sys.stderr)
    doc["machine"]["load_avg_1m_end"] = os.getloadavg()[0]
    for entry in doc["servers"]:  # without --model, the id each server listed first
        entry["model"] = entry["model"] or next((run["result"].get("model_id") for run in doc["runs"]
                                                 if run["label"] == entry["label"] and "result" in run), None)
    doc["aggregate"] = aggregate(doc["runs"], [s.label for s in servers], axis.values)
    doc["ratios"] = ratios(doc["aggregate"], baseline)
    doc["better"] = {metric: better_when(metric) for row in doc["ratios"] for metric in row["ratio"]}
    paths = write_outputs(out_dir, doc)
    print(paths[1].read_text())
    print("wrote " + ", ".join(map(str, paths)), file=sys.stderr)
    incomplete = [run for run in doc["runs"] if not (run.get("result") or {}).get("completed")]
    return 0 if doc["complete"] and not incomplete else 1


def main(args: argparse.Namespace) -> int:
    labels = [server.label for server in args.server]
    baseline = args.baseline or labels[0]
    try:
        if len(set(labels)) != len(labels):
            raise ValueError(f"server labels must differ: {labels}")
        if baseline not in labels:
            raise ValueError(f"--baseline {baseline!r} is not one of {labels}")
        axis = resolve_axis(args, DEFAULT_CONCURRENCY)
    except ValueError as exc:
        print(f"rill bench compare: error: {exc}", file=sys.stderr)
        return 2
    return execute("compare", args, args.server, axis, baseline)
