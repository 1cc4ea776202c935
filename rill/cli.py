"""The `rill` command: `rill serve` and its flags."""
from __future__ import annotations

import argparse
import os
import re
import sys

from rill.chat_flags import add_chat_flags, check_chat_flags
from rill.kv_disk_flags import add_kv_disk_flags, check_kv_disk_flags
from rill.kv_dtype_flags import add_kv_cache_dtype_flag, check_kv_cache_dtype_flag
from rill.listening import add_listen_flags, check_listen_flags
from rill.lora_flags import add_lora_flags, check_lora_flags
from rill.parallel_flags import add_parallel_flags, check_parallel_flags
from rill.quantization_flags import add_quantization_flags, check_quantization_flags
from rill.systemd_unit import add_systemd_unit_parser, print_unit
from rill.vllm_flags import add_vllm_flags, check_vllm_flags

_SIZE = re.compile(r"^\s*([\d.]+)\s*([KMGT]?i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "KIB": 2**10, "M": 1e6, "MB": 1e6, "MIB": 2**20,
          "G": 1e9, "GB": 1e9, "GIB": 2**30, "T": 1e12, "TB": 1e12, "TIB": 2**40}


def byte_size(text: str) -> int:
    """'2GiB', '512MiB' or '1073741824' -> bytes."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").upper() if match else None
    if not match or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (try 2GiB or 512MiB)")
    return int(float(match.group(1)) * _UNITS[unit])


def serve_parser(sub) -> argparse.ArgumentParser:
    ap = sub.add_parser("serve", help="serve a model over the OpenAI API",
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    net = ap.add_argument_group("HTTP")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    net.add_argument("--port", type=int, default=8000)
    net.add_argument("--workers", type=int, default=1, help="API worker processes sharing the one engine")
    net.add_argument("--sse-keepalive", type=float, default=15.0,
                     help="seconds of silence on a stream before a ': keep-alive' comment goes out")
    net.add_argument("--shutdown-timeout", type=float, default=30.0,
                     help="seconds in-flight requests get to finish on SIGTERM/SIGINT")
    net.add_argument("--max-request-body", type=byte_size, default="32MiB", help="larger bodies get 413")
    net.add_argument("--state-store", default="", metavar="URL",
                     help="where the Responses API and Conversations keep their state, shared by every API worker: "
                          "empty (default) for SQLite in the run directory, gone when the server stops; "
                          "sqlite:///path/state.db to keep it across restarts; redis://host:port/db to share it "
                          "between servers")
    net.add_argument("--responses-store-max-entries", type=int, default=1000,
                     help="responses kept (by the store, across workers) for GET /v1/responses/{id} and "
                          "previous_response_id; the oldest go first (0 disables the store)")
    net.add_argument("--responses-store-ttl", type=float, default=3600.0,
                     help="seconds a stored response is kept (0 disables the store)")
    net.add_argument("--conversations-store-max-entries", type=int, default=1000,
                     help="conversations kept (by the store, across workers) for /v1/conversations and `conversation` "
                          "(0 disables the store)")
    net.add_argument("--conversations-store-ttl", type=float, default=3600.0,
                     help="seconds a conversation is kept, counted from its creation (0 disables the store)")
    net.add_argument("--chat-completions-store-max-entries", type=int, default=1000,
                     help="chat completions created with `store: true` kept (by the store, across workers) for "
                          "GET /v1/chat/completions and its routes; the oldest go first (0 disables the store)")
    net.add_argument("--chat-completions-store-ttl", type=float, default=3600.0,
                     help="seconds a stored chat completion is kept, counted from its creation (0 disables the store)")
    net.add_argument("--files-dir", default="", metavar="PATH",
                     help="where the Batch API's files are kept (default: a `files` folder beside the SQLite state "
                          "store; in the run directory for the default store or Redis: give a shared folder to "
                          "servers that share a Redis store)")
    net.add_argument("--files-max-bytes", type=byte_size, default="100MiB", help="the largest file POST /v1/files takes")
    net.add_argument("--files-max-count", type=int, default=1000,
                     help="files kept (uploads and batch results); uploads past it get 400. Also the batches kept")
    net.add_argument("--batch-max-lines", type=int, default=50_000, help="requests in one batch input file")
    net.add_argument("--batch-concurrency", type=int, default=4,
                     help="batch requests this server runs at once while no interactive request runs (one while "
                          "some do, none while any waits); 0: this server runs no batch")
    model = ap.add_argument_group("model")
    model.add_argument("--model", default=None,
                       help="a local Hugging Face model directory, a GGUF file, or a hub id (ORG/NAME) found in "
                            "the local Hugging Face cache; never downloaded (default: the bundled "
                            "SmolLM2-135M-Instruct)")
    model.add_argument("model_path", nargs="?", default=None, metavar="MODEL",
                       help="the same as --model, where `vllm serve` takes it (first, before any flag)")
    model.add_argument("--revision", default=None,
                       help="a hub id's branch, tag or commit in the cache (vLLM's; default: main)")
    model.add_argument("--download-dir", default=None, metavar="DIR",
                       help="the Hugging Face cache a hub id is looked up in (vLLM's name; default: $HF_HUB_CACHE, "
                            "else $HF_HOME/hub, else ~/.cache/huggingface/hub)")
    model.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                       help="the model id clients use; more names are aliases of it (vLLM's)")
    model.add_argument("--chat-template", default=None, help="a jinja2 chat template file to use instead of the model's")
    model.add_argument("--generation-config", default="auto",
                       help="auto: a request that leaves out temperature, top_p, top_k, min_p or repetition_penalty "
                            "gets the model's generation_config.json value (a GGUF's general.sampling.*), as vLLM "
                            "does; vllm or none: Rill's defaults; a folder: its generation_config.json")
    model.add_argument("--override-generation-config", default=None,
                       help='sampling defaults set on top, as JSON: {"temperature": 0.6, "top_p": 0.95}')
    model.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                       help="auto: bfloat16 on a GPU, and on a CPU with AMX-BF16 or AVX512-BF16; float32 on other "
                            "CPUs (the start-up log and /stats say which and why)")
    add_quantization_flags(model)
    model.add_argument("--speculative-config", type=speculative_config, default="",
                       help='speculative decoding, as vLLM spells it (JSON): {"method": "ngram", '
                            '"num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5} drafts '
                            'from the request\'s own text; {"method": "draft_model", "model": DIR, '
                            '"num_speculative_tokens": 4} from a smaller model (see docs/speculative-decoding.md)')
    model.add_argument("--jump-forward-tokens", type=_non_negative(int), default=8,
                       help="drafts a step, at most, from the text a structured output's grammar forces next (a "
                            "JSON key, its quotes and colon), verified by the model as speculative drafts; 0 off "
                            "(see docs/structured-outputs.md)")
    model.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                       help="auto: cuda when torch sees a GPU, else cpu")
    model.add_argument("--attention-backend", default="auto", choices=["auto", "cpu", "torch", "triton"],
                       help="auto: the Triton kernels on a GPU; on the CPU, cpu (Rill's C++ paged decode "
                            "kernel, built at first start, and SDPA for prefill) where a C++ compiler is found, "
                            "else torch (SDPA over gathered blocks)")
    model.add_argument("--load-format", default="auto", choices=["auto", "dummy"],
                       help="dummy: random weights from the config, no weight files read")
    model.add_argument("--model-impl", default="auto", choices=["auto", "native", "transformers"],
                       help="native: Rill's own Llama-family model (an error for other architectures); "
                            "transformers: transformers' own model over Rill's paged KV cache and attention kernels; "
                            "auto: native where supported, else transformers")
    model.add_argument("--cache-dir", default=None,
                       help="where the bundled model is converted once (default $RILL_CACHE or ~/.cache/rill)")
    engine = ap.add_argument_group("engine")
    engine.add_argument("--max-model-len", type=int, default=None, help="context length (default: the model's)")
    engine.add_argument("--max-logprobs", type=_logprobs_count, default=20,
                        help="most top logprobs a request may ask for a token (top_logprobs, logprobs, prompt_logprobs, "
                             "n_probs), as vLLM's: -1 the whole vocabulary")
    engine.add_argument("--kv-cache-memory", type=byte_size, default="1GiB", help="KV cache size on CPU")
    add_kv_cache_dtype_flag(engine)
    engine.add_argument("--block-size", type=int, default=16, help="tokens per KV cache block")
    engine.add_argument("--max-num-seqs", type=int, default=64, help="most requests in the running batch")
    engine.add_argument("--max-num-batched-tokens", type=int, default=2048, help="token budget of one engine step")
    engine.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                        help="reuse the KV blocks of prompt prefixes that earlier requests computed")
    engine.add_argument("--enable-cache-reset", action="store_true",
                        default=os.environ.get("VLLM_SERVER_DEV_MODE", "") == "1",
                        help="serve POST /reset_prefix_cache (vLLM's) and /flush_cache (SGLang's), which empty the "
                             "prefix cache, behind the API key (VLLM_SERVER_DEV_MODE=1, vLLM's switch for it, "
                             "turns this on too)")
    engine.add_argument("--task", choices=["auto", "generate", "embed", "score", "classify"], default="auto",
                        help="what to serve: auto follows the model directory (a cross-encoder scores, a "
                             "classifier of several labels classifies, a sentence-transformers model embeds, a "
                             "decoder generates); score on a decoder serves it as a yes/no reranker "
                             "(Qwen3-Reranker's recipe) on /rerank and /score only; classify serves a one-label "
                             "classifier (a reward model) on /classify")
    engine.add_argument("--enable-embeddings", action="store_true",
                        help="serve POST /v1/embeddings with the generating model too: its last token's final "
                             "hidden state, L2-normalised (an embedding model in the sentence-transformers layout "
                             "serves embeddings without this flag, and only them)")
    engine.add_argument("--data-parallel-size", type=_positive_int, default=1, metavar="N",
                        help="run N engine processes, each with its own KV cache, behind the same API workers; "
                             "a request goes to the engine holding its prompt's prefix unless it is overloaded, "
                             "else to the least-loaded one (on a CPU each gets cores / N threads)")
    add_parallel_flags(engine)
    add_kv_disk_flags(engine, byte_size)
    add_lora_flags(ap)
    engine.add_argument("--kv-events-endpoint", default="", metavar="ENDPOINT",
                        help="publish KV-cache events (vLLM's kv_events schema: blocks stored and removed) on this "
                             "ZeroMQ PUB endpoint, e.g. tcp://127.0.0.1:5557, for KV-aware routers; they carry every user's "
                             "prompt token ids to whoever connects, whatever --api-key says (docs/kv-events.md)")
    engine.add_argument("--kv-events-topic", default="", help="the topic frame of each KV-event message")
    engine.add_argument("--batch-invariant", action="store_true",
                        help="a request's logits are bit for bit the same whatever else is in the step "
                             "(same seed, same prompt, same output); costs decode speed, see README")
    engine.add_argument("--enforce-eager", action="store_true",
                        help="run every step eagerly: no torch.compile of decode steps at start (which takes "
                             "about a minute the first time, seconds from the disk cache after)")
    engine.add_argument("--num-threads", type=int, default=None, help="torch threads in the engine (default: torch's)")
    ap.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_admission_flags(ap)
    add_auth_proxy_log_flags(ap)
    add_metrics_flags(ap)
    add_chat_flags(ap)
    add_listen_flags(ap)
    add_vllm_flags(ap)
    return ap


def _positive_int(text: str) -> int:
    if not (text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"not a whole number >= 1: {text!r}")
    return int(text)


def _logprobs_count(text: str) -> int:
    if not re.fullmatch(r"-1|[0-9]{1,7}", text):
        raise argparse.ArgumentTypeError(f"not a whole number >= -1: {text!r}")
    return int(text)


def _non_negative(convert):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = -1
        if not value >= 0:  # also refuses nan
            raise argparse.ArgumentTypeError(f"not a number >= 0: {text!r}")
        return value

    parse.__name__ = convert.__name__
    return parse


def add_admission_flags(ap: argparse.ArgumentParser) -> None:
    """Bounds on the engine's waiting queue and on a request's time (README: "Admission control")."""
    admission = ap.add_argument_group("admission control")
    admission.add_argument("--max-queued-requests", type=_non_negative(int), default=0, metavar="N",
                           help="most requests waiting for a seat in the running batch (--max-num-seqs); "
                                "past it a request gets 429 with Retry-After at once; 0: no limit")
    admission.add_argument("--max-queued-tokens", type=_non_negative(int), default=0, metavar="N",
                           help="most prompt tokens of the waiting requests; past it 429 likewise; 0: no limit")
    admission.add_argument("--request-timeout", type=_non_negative(float), default=0.0, metavar="SECONDS",
                           help="end a request this long after it reached the engine: an error event "
                                "`request_timeout` ends a stream, else 504; 0: no timeout")
    admission.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="fcfs",
                           help="fcfs: first come, first served; priority: a request's `priority` field orders the "
                                "queue (lower first, vLLM's), preempting worse running work (docs/priority.md)")
    admission.add_argument("--priority-aging", type=_non_negative(float), default=60.0, metavar="SECONDS",
                           help="under --scheduling-policy priority: a waiting request's priority improves by one "
                                "per this long, so none starves; 0: no aging")


def _metrics_prefix(text: str) -> str:
    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", text):
        raise argparse.ArgumentTypeError(f"not a metric name prefix: {text!r} (letters, digits, _)")
    return text


def _otlp_endpoint(text: str) -> str:
    if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", text):
        raise argparse.ArgumentTypeError(f"not an OTLP/HTTP URL: {text!r} (http://HOST:4318/v1/traces)")
    return text


def add_metrics_flags(ap: argparse.ArgumentParser) -> None:
    """GET /metrics and traces (README: "Metrics")."""
    metrics = ap.add_argument_group("metrics and traces")
    metrics.add_argument("--metrics-prefix", type=_metrics_prefix, default="rill",
                         help="prefix of every /metrics name (rill:time_to_first_token_seconds); "
                              "vllm: existing vLLM dashboards work unchanged")
    metrics.add_argument("--otlp-traces-endpoint", type=_otlp_endpoint, default=None, metavar="URL",
                         help="send an OpenTelemetry span per request (vLLM's attributes, joined to the caller's "
                              "traceparent) to this OTLP/HTTP collector URL, e.g. http://HOST:4318/v1/traces "
                              "(docs/tracing.md); none: no tracing")


def _str_list(text: str) -> list[str]:
    from rill.asgi.http.cors import parse_list

    try:
        return parse_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_auth_proxy_log_flags(ap: argparse.ArgumentParser) -> None:
    """API keys, CORS and connections, logs (README: "API keys", "Browsers, proxies", "Logs")."""
    auth = ap.add_argument_group("API keys")
    auth.add_argument("--api-key", action="append", default=None, metavar="KEY",
                      help="a key clients must send as `Authorization: Bearer KEY` on every path but the probes (repeatable; "
                           "also $RILL_API_KEY; prefer that or --api-key-file: argv is visible to `ps`)")
    auth.add_argument("--api-key-file", action="append", default=None, metavar="PATH",
                      help="a file of keys, one a line, # comments and blank lines skipped (repeatable)")
    auth.add_argument("--protect-metrics", action="store_true",
                      help="/metrics, /stats, /version and /loads need a key too (/health and /ready stay open)")
    auth.add_argument("--prefix-cache-isolation", choices=["none", "key"], default=None,
                      help="key: a request never hits prefix-cache blocks that a request with another API key "
                           "cached (its cached_tokens and TTFT tell it nothing of other keys' prompts); none: one "
                           "cache for all. Default: key with API keys, else none (docs/prefix-caching.md)")
    proxies = ap.add_argument_group("browsers and proxies")
    proxies.add_argument("--allowed-origins", type=_str_list, default=[], metavar="ORIGINS",
                         help="CORS origins, comma-separated or a JSON list ('*' for any); none: CORS off")
    proxies.add_argument("--allowed-methods", type=_str_list, default=["GET", "POST"], metavar="METHODS",
                         help="CORS methods")
    proxies.add_argument("--allowed-headers", type=_str_list, default=["*"], metavar="HEADERS",
                         help="CORS request headers ('*': whatever the browser asks for)")
    proxies.add_argument("--timeout-keep-alive", type=float, default=125.0, metavar="SECONDS",
                         help="seconds an idle HTTP/1 connection stays open (and a client has to send its "
                              "headers); above a proxy's idle timeout (60-120 s), so the proxy closes first; "
                              "0: no keep-alive")
    logs = ap.add_argument_group("logs")
    logs.add_argument("--log-format", default="text", choices=["text", "json"],
                      help="json: every line of every process is one JSON object")
    logs.add_argument("--access-log", action=argparse.BooleanOptionalAction, default=True,
                      help="one line per request on the rill.access logger (at info level)")
    logs.add_argument("--disable-uvicorn-access-log", dest="access_log", action="store_false",
                      help="vLLM's name for --no-access-log")
    logs.add_argument("--log-requests", "--enable-log-requests", action="store_true",
                      help="also log each request's prompt or messages (a debug line on rill.requests, "
                           "shown whatever --log-level); without it no prompt text is ever logged")


def speculative_config(text: str) -> str:
    """--speculative-config checked at once (argparse exits 2 with the message)."""
    from pathlib import Path

    from rill.engine_proc.spec.config import parse_speculative_config

    try:
        config = parse_speculative_config(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--speculative-config: ")) from None
    if config is not None and config.model and not (Path(config.model) / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"draft model {config.model!r}: no config.json there")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rill", description="Rill: an OpenAI-compatible LLM inference server.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = serve_parser(sub)
    add_systemd_unit_parser(sub)
    # The bench parsers import aiohttp and numpy: build them only for `rill bench`.
    sub.add_parser("bench", help="serving benchmarks: serve, compare, sweep (rill bench -h)",
                           add_help=False)
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:  # its own parser, so that `rill bench -h` and every flag pass through
        from rill.bench.__main__ import main as bench_main

        try:
            sys.exit(bench_main(argv[1:], prog="rill bench"))
        except ModuleNotFoundError as e:  # the `bench` extra is not installed
            if e.name not in ("aiohttp", "tqdm", "matplotlib"):
                raise
            sys.exit(f"rill bench needs the bench extra ({e.name} is not installed): pip install 'rill[bench]'")
    args = parser.parse_args(argv)
    if args.command == "serve":
        check_chat_flags(args, serve)
        check_parallel_flags(args, serve)
        check_lora_flags(args, serve)
        check_kv_cache_dtype_flag(args, serve)
        check_quantization_flags(args, serve)
        check_listen_flags(args, serve)
        check_kv_disk_flags(args, serve, byte_size)
        check_vllm_flags(args)
        if args.model_path is not None:
            if args.model is not None and args.model != args.model_path:
                serve.error(f"the model is given twice: {args.model_path} and --model {args.model}")
            args.model = args.model_path
        if args.headless:
            from rill.headless import serve_headless

            sys.exit(serve_headless(args))
        from rill.launcher import serve as run_serve

        sys.exit(run_serve(args))
    if args.command == "systemd-unit":
        sys.exit(print_unit(args, serve_parser))


if __name__ == "__main__":
    main()
