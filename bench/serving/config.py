"""The options of `bench serve`: the BenchConfig dataclass and the argparse flags that fill it.

Flag names follow `vllm bench serve` wherever the option means the same thing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import dataclass, field

from rill.bench.serving.metrics import METRIC_NAMES, parse_goodput


@dataclass
class BenchConfig:
    # The server.
    base_url: str = "http://127.0.0.1:8000"
    endpoint: str = "/v1/completions"  # or /v1/chat/completions
    model: str | None = None  # None: the first id GET /v1/models lists
    api_key: str | None = None  # None: $OPENAI_API_KEY, if set
    headers: dict[str, str] = field(default_factory=dict)
    request_timeout_s: float = 6 * 3600.0
    # The workload.
    dataset_name: str = "random"  # random | conversations
    dataset_path: str | None = None  # a JSONL of {"prompt", "output_len"} for conversations
    num_prompts: int = 100
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    conversations_output_len: int | None = None  # None: each row's own output_len
    tokenizer: str | None = None  # tokenizer.json or a model dir; None: the bundled model's
    seed: int = 0
    # The load.
    max_concurrency: int | None = None
    request_rate: float = math.inf  # requests/s; inf sends everything at once
    burstiness: float = 1.0
    num_warmups: int = 1
    max_duration_s: float | None = None
    drain_timeout_s: float = 30.0
    # What each request asks for.
    ignore_eos: bool = True  # force output_len tokens: ignore_eos + min_tokens
    temperature: float = 0.0
    extra_body: dict = field(default_factory=dict)
    require_done: bool = True  # a stream must end with data: [DONE] to count as completed
    # The report.
    percentile_metrics: list[str] = field(default_factory=lambda: list(METRIC_NAMES))
    metric_percentiles: list[float] = field(default_factory=lambda: [90.0, 99.0])
    goodput: dict[str, float] = field(default_factory=dict)  # SLOs in ms, e.g. {"ttft": 500}
    disable_tqdm: bool = False
    label: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    save_result: bool = False
    result_dir: str | None = None
    result_filename: str | None = None


def _key_values(items: list[str] | None, what: str) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what} {item!r}: expected KEY=VALUE")
        pairs[key.strip()] = value.strip()
    return pairs


def _csv_floats(text: str) -> list[float]:
    return [float(p) for p in text.split(",") if p.strip()]


def add_serve_args(parser: argparse.ArgumentParser) -> None:
    """The `bench serve` flags; config_from_args turns the parsed namespace into a BenchConfig."""
    d = BenchConfig()
    server = parser.add_argument_group("server")
    server.add_argument("--base-url", default=None,
                        help=f"the server's base URL (default: http://HOST:PORT, i.e. {d.base_url})")
    server.add_argument("--host", default="127.0.0.1", help="used when --base-url is not given")
    server.add_argument("--port", type=int, default=8000, help="used when --base-url is not given")
    server.add_argument("--endpoint", default=d.endpoint, help="/v1/completions or /v1/chat/completions")
    server.add_argument("--model", default=None, help="model id to request (default: the first of GET /v1/models)")
    server.add_argument("--api-key", default=None, help="sent as a Bearer token (default: $OPENAI_API_KEY)")
    server.add_argument("--header", metavar="KEY=VALUE", nargs="*", help="extra HTTP headers for every request")
    server.add_argument("--request-timeout", type=float, default=d.request_timeout_s,
                        help="seconds one request may take in all")
    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset-name", default=d.dataset_name, choices=["random", "conversations"],
                      help="random: random tokens of exact lengths; conversations: the bundled chat prompts")
    data.add_argument("--dataset-path", default=None,
                      help="for conversations: a JSONL file of {\"prompt\": ..., \"output_len\": ...} lines")
    data.add_argument("--num-prompts", type=int, default=d.num_prompts, help="requests to measure")
    data.add_argument("--random-input-len", type=int, default=d.random_input_len,
                      help="prompt tokens (for chat: tokens of the message content, template excluded)")
    data.add_argument("--random-output-len", type=int, default=d.random_output_len, help="max_tokens per request")
    data.add_argument("--random-range-ratio", type=float, default=d.random_range_ratio,
                      help="lengths are drawn uniformly from [len * (1 - r), len * (1 + r)], 0 <= r < 1")
    data.add_argument("--random-prefix-len", type=int, default=d.random_prefix_len,
                      help="random tokens shared by every prompt, before its own --random-input-len")
    data.add_argument("--conversations-output-len", type=int, default=None,
                      help="max_tokens for every conversations prompt (default: each prompt's own)")
    data.add_argument("--tokenizer", default=None,
                      help="tokenizer.json, or a model directory, to count tokens with (default: the bundled model's)")
    data.add_argument("--seed", type=int, default=d.seed)
    load = parser.add_argument_group("load")
    load.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    load.add_argument("--request-rate", type=float, default=d.request_rate,
                      help="requests per second, arriving as a Poisson/gamma process; inf sends all at once")
    load.add_argument("--burstiness", type=float, default=d.burstiness,
                      help="gamma shape of the arrival gaps: 1 is Poisson, < 1 burstier, > 1 more even")
    load.add_argument("--num-warmups", type=int, default=d.num_warmups,
                      help="requests sent and discarded before the measured run")
    load.add_argument("--max-duration", type=float, default=None,
                      help="seconds after which no new request is sent; the report covers what completed")
    load.add_argument("--drain-timeout", type=float, default=d.drain_timeout_s,
                      help="seconds in-flight requests get after --max-duration before they are cancelled")
    req = parser.add_argument_group("request")
    req.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=d.ignore_eos,
                     help="force the output length: send ignore_eos and min_tokens = max_tokens")
    req.add_argument("--no-force-output-len", dest="ignore_eos", action="store_false",
                     help="same as --no-ignore-eos, for servers that reject ignore_eos")
    req.add_argument("--no-require-done", dest="require_done", action="store_false",
                     help="count a stream that closes without data: [DONE] as complete (transformers serve)")
    req.add_argument("--temperature", type=float, default=d.temperature)
    req.add_argument("--extra-body", type=json.loads, default=None,
                     help="a JSON object merged into every request body")
    report = parser.add_argument_group("report")
    report.add_argument("--percentile-metrics", default=",".join(d.percentile_metrics),
                        help="metrics whose stats are printed, from " + ",".join(METRIC_NAMES))
    report.add_argument("--metric-percentiles", default=",".join(f"{p:g}" for p in d.metric_percentiles),
                        help="comma-separated percentiles, e.g. 50,90,99")
    report.add_argument("--goodput", nargs="+", metavar="NAME:MS",
                        help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:2000; a request is good if it meets all")
    report.add_argument("--disable-tqdm", action="store_true", help="no progress bar")
    report.add_argument("--label", default=None, help="a label for the result (and its file name)")
    report.add_argument("--metadata", metavar="KEY=VALUE", nargs="*", help="extra fields for the result JSON")
    report.add_argument("--save-result", action="store_true", help="write the result as JSON")
    report.add_argument("--result-dir", default=None, help="where the JSON goes (default: the current directory)")
    report.add_argument("--result-filename", default=None, help="the JSON's file name (default: vLLM's pattern)")


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """A BenchConfig from add_serve_args' namespace; raises ValueError on a malformed flag."""
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    unknown = sorted(set(metrics) - set(METRIC_NAMES))
    if unknown:
        raise ValueError(f"--percentile-metrics: unknown {', '.join(unknown)} (choose from {', '.join(METRIC_NAMES)})")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError("--max-concurrency must be >= 1")
    if args.num_prompts < 1:
        raise ValueError("--num-prompts must be >= 1")
    if not (args.request_rate > 0 and args.burstiness > 0):
        raise ValueError("--request-rate and --burstiness must be > 0")
    if not 0 <= args.random_range_ratio < 1:
        raise ValueError("--random-range-ratio must be in [0, 1)")
    return BenchConfig(
        base_url=args.base_url or f"http://{args.host}:{args.port}",
        endpoint=args.endpoint if args.endpoint.startswith("/") else "/" + args.endpoint,
        model=args.model,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY"),
        headers=_key_values(args.header, "--header"),
        request_timeout_s=args.request_timeout,
        dataset_name=args.dataset_name,
        dataset_path=args.dataset_path,
        num_prompts=args.num_prompts,
        random_input_len=args.random_input_len,
        random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio,
        random_prefix_len=args.random_prefix_len,
        conversations_output_len=args.conversations_output_len,
        tokenizer=args.tokenizer,
        seed=args.seed,
        max_concurrency=args.max_concurrency,
        request_rate=args.request_rate,
        burstiness=args.burstiness,
        num_warmups=args.num_warmups,
        max_duration_s=args.max_duration,
        drain_timeout_s=args.drain_timeout,
        ignore_eos=args.ignore_eos,
        temperature=args.temperature,
        extra_body=args.extra_body or {},
        require_done=args.require_done,
        percentile_metrics=metrics,
        metric_percentiles=_csv_floats(args.metric_percentiles),
        goodput=parse_goodput(args.goodput or []),
        disable_tqdm=args.disable_tqdm,
        label=args.label,
        metadata=_key_values(args.metadata, "--metadata"),
        save_result=args.save_result,
        result_dir=args.result_dir,
        result_filename=args.result_filename,
    )
