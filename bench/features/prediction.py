"""`python -m rill.bench.features.prediction`: OpenAI's Predicted Outputs against none, on one `rill serve` of the
bundled model with its defaults (no --speculative-config), concurrency 1.

The workload edits a file: each chat request asks the model to rename a variable in a function of Python's
standard library (its source as the file) and answer with the whole function, greedy, at most the function's
length plus 32 tokens. Each is sent twice, without and with the function's source as `prediction`, alternating,
so that both see the same server and the same noise. Latency is the time per output token (TPOT: from the first
streamed token to the last, over the tokens after the first, counted by the usage the server returns): a step
of accepted drafts streams several tokens at once.
"""
from __future__ import annotations

import argparse
import asyncio
import difflib
import inspect
import shlex
import statistics
import string
import tempfile
import textwrap
from pathlib import Path

import httpx

from rill.bench.features.speculative import MODEL, latency, run
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

# (function, the variable to rename, its new name)
EDITS = [(textwrap.dedent, "margin", "common"), (textwrap.indent, "predicate", "keep"),
         (shlex.quote, "s", "text"), (string.capwords, "sep", "separator"),
         (difflib.get_close_matches, "result", "scored"), (textwrap.shorten, "width", "limit")]


def edit_bodies(num: int) -> list[tuple[dict, str]]:
    """(a chat request body, the file it edits), for the first `num` edits."""
    out = []
    for func, old, new in EDITS[:num]:
        source = inspect.getsource(func)
        ask = (f"Rename the variable `{old}` to `{new}` in this Python function. Answer with the whole function "
               f"and nothing else.\n\n```python\n{source}```")
        out.append(({"messages": [{"role": "user", "content": ask}], "max_tokens": min(1024, len(source) // 3 + 32)},
                    source))
    return out


def measure(flags: list[str], log: Path, quick: bool) -> dict:
    bodies = edit_bodies(2 if quick else len(EDITS))
    plain, predicted, usage, same = [], [], [], 0
    with rill_server(*flags, log_path=log).wait_ready(900) as srv:
        url = srv.base_url
        asyncio.run(run(url, [bodies[0][0]], 1))  # warm up
        for body, source in bodies:
            plain += asyncio.run(run(url, [body], 1))
            with_prediction = {**body, "prediction": {"type": "content", "content": source}}
            predicted += asyncio.run(run(url, [with_prediction], 1))
            answers = [httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
                "model": MODEL, "temperature": 0, **b}).json() for b in (body, with_prediction)]
            usage.append(answers[1]["usage"])
            same += answers[0]["choices"][0]["message"]["content"] == answers[1]["choices"][0]["message"]["content"]
        stats = httpx.get(f"{url}/stats", timeout=30).json()
    accepted = sum(u["completion_tokens_details"]["accepted_prediction_tokens"] for u in usage)
    rejected = sum(u["completion_tokens_details"]["rejected_prediction_tokens"] for u in usage)
    return {"off": latency(plain), "prediction": latency(predicted), "dtype": stats.get("dtype"),
            "accepted_prediction_tokens": accepted, "rejected_prediction_tokens": rejected,
            "completion_tokens": sum(u["completion_tokens"] for u in usage), "same_text": same,
            "tpot_ratio_per_request": [p["tpot"] / o["tpot"] for o, p in zip(per_request(plain), per_request(predicted))]}


def per_request(results: list[dict]) -> list[dict]:
    return [{"tpot": (r["times"][-1] - r["times"][1]) / (r["tokens"] - 1)} for r in results]


def report_markdown(report: dict) -> str:
    off, pred = report["figures"]["off"], report["figures"]["prediction"]
    figures = report["figures"]
    machine = report["machine"]
    rows = [["edit a file, concurrency 1: time per output token", f"{off['tpot_ms']:.2f} ms",
             f"{pred['tpot_ms']:.2f} ms", f"{pred['tpot_ms'] / off['tpot_ms']:.2f}x"],
            ["the same: median gap between streamed events", f"{off['median_event_gap_ms']:.2f} ms",
             f"{pred['median_event_gap_ms']:.2f} ms", f"{pred['median_event_gap_ms'] / off['median_event_gap_ms']:.2f}x"]]
    ratios = ", ".join(f"{r:.2f}" for r in figures["tpot_ratio_per_request"])
    return (f"# Predicted outputs against none\n\n`{report['command']}` on {machine.get('cpu_model', '?')} "
            f"({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), {report['date']}; the bundled "
            f"model ({figures['dtype']}), `rill serve` with its defaults; {len(figures['tpot_ratio_per_request'])} "
            f"edits of standard-library functions, each without and with its source as `prediction`.\n\n"
            + table(["figure", "no prediction", "prediction", "prediction / none"], rows)
            + f"\n\nPer request, TPOT with / without: {ratios} (median "
              f"{statistics.median(figures['tpot_ratio_per_request']):.2f}). Predicted tokens accepted "
              f"{figures['accepted_prediction_tokens']}, rejected {figures['rejected_prediction_tokens']}, of "
              f"{figures['completion_tokens']} completion tokens. Greedy texts the same with and without: "
              f"{figures['same_text']} of {len(figures['tpot_ratio_per_request'])}.\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true", help="two edits, an eager server: checks the bench runs")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-prediction-"))
    figures = measure(["--enforce-eager"] if args.quick else [], tmp / "server.log", args.quick)
    report = {**provenance("rill.bench.features.prediction", argv, args.machine), "figures": figures}
    md = report_markdown(report)
    if not args.quick:
        save_results(args.out / f"prediction-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
