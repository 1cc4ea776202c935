"""The result on the terminal (vLLM's "Serving Benchmark Result" block) and as a JSON file."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from rill.bench.serving.metrics import METRIC_NAMES, percentile_key

_HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
}
_WIDTH = 50
_MAX_ERRORS_SHOWN = 5


def _row(label: str, value, fmt: str = "") -> str:
    return f"{label:<40} {value:<10{fmt}}"


def _percentiles(result: dict, name: str) -> list[float]:
    listed = result.get("metric_percentiles")
    if listed is not None:
        return listed
    prefix, suffix = "p", f"_{name}_ms"  # a vLLM result: find its pNN_ fields
    return [float(k[len(prefix):-len(suffix)]) for k in result if k.startswith(prefix) and k.endswith(suffix)]


def format_result(result: dict) -> str:
    lines = [" Serving Benchmark Result ".center(_WIDTH, "="),
             _row("Successful requests:", result["completed"]),
             _row("Failed requests:", result["failed"])]
    for key, label in (("num_cancelled", "Cancelled requests (--max-duration):"),
                       ("num_not_sent", "Requests not sent (--max-duration):")):
        if result.get(key):
            lines.append(_row(label, result[key]))
    if result.get("max_concurrency") is not None:
        lines.append(_row("Maximum request concurrency:", result["max_concurrency"]))
    if result.get("request_rate") not in (None, "inf"):
        lines.append(_row("Request rate configured (RPS):", result["request_rate"], ".2f"))
    lines += [_row("Benchmark duration (s):", result["duration"], ".2f"),
              _row("Total input tokens:", result["total_input_tokens"]),
              _row("Total generated tokens:", result["total_output_tokens"])]
    if result.get("output_token_source"):
        lines.append(_row("Output token count source:", result["output_token_source"]))
    lines.append(_row("Request throughput (req/s):", result["request_throughput"], ".2f"))
    if result.get("request_goodput") is not None:
        lines.append(_row("Request goodput (req/s):", result["request_goodput"], ".2f"))
    lines.append(_row("Output token throughput (tok/s):", result["output_throughput"], ".2f"))
    if "max_output_tokens_per_s" in result:
        lines += [_row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"], ".2f"),
                  _row("Peak concurrent requests:", result["max_concurrent_requests"])]
    lines.append(_row("Total Token throughput (tok/s):", result["total_token_throughput"], ".2f"))
    for name in result.get("percentile_metrics") or METRIC_NAMES:
        if f"mean_{name}_ms" not in result:
            continue
        short, header = _HEADERS[name]
        lines += [header.center(_WIDTH, "-"),
                  _row(f"Mean {short} (ms):", result[f"mean_{name}_ms"], ".2f"),
                  _row(f"Median {short} (ms):", result[f"median_{name}_ms"], ".2f"),
                  _row(f"Std {short} (ms):", result[f"std_{name}_ms"], ".2f")]
        for p in _percentiles(result, name):
            key = percentile_key(p)
            if f"{key}_{name}_ms" in result:
                lines.append(_row(f"{key.upper()} {short} (ms):", result[f"{key}_{name}_ms"], ".2f"))
    lines.append("=" * _WIDTH)
    if result.get("input_len_unit"):
        lines.append(f"Input lengths count {result['input_len_unit']}.")
    return "\n".join(lines)


def format_errors(result: dict) -> str:
    """Failed requests grouped by error text, most frequent first ('' if none failed)."""
    counts = Counter(e for e in result.get("errors") or [] if e)
    if not counts:
        return ""
    lines = [f"Errors ({sum(counts.values())} failed requests, {len(counts)} distinct):"]
    for error, count in counts.most_common(_MAX_ERRORS_SHOWN):
        lines.append(f"  {count} x {error[:300]}")
    if len(counts) > _MAX_ERRORS_SHOWN:
        lines.append(f"  ... and {len(counts) - _MAX_ERRORS_SHOWN} more (see \"errors\" in the JSON)")
    return "\n".join(lines)


def print_result(result: dict) -> None:
    print(format_result(result))
    errors = format_errors(result)
    if errors:
        print(errors)


def default_result_filename(result: dict) -> str:
    """vLLM's pattern: {label}-{rate}qps[-concurrency{N}]-{model}-{date}.json."""
    label = result.get("label") or result.get("backend", "openai")
    rate = result.get("request_rate", "inf")
    rate = f"{float(rate)}" if rate != "inf" else "inf"
    concurrency = f"-concurrency{result['max_concurrency']}" if result.get("max_concurrency") else ""
    model = str(result.get("model_id", "model")).rstrip("/").split("/")[-1]
    return f"{label}-{rate}qps{concurrency}-{model}-{result.get('date', 'now')}.json"


def save_result(result: dict, result_dir: str | None = None, result_filename: str | None = None) -> Path:
    path = Path(result_dir or ".") / (result_filename or default_result_filename(result))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return path
