"""`python -m rill.bench.features.jump_forward`: structured outputs with jump-forward drafts (`rill serve`'s default,
--jump-forward-tokens 8) against none (--jump-forward-tokens 0), the bundled model, the same requests, servers one
after the other, each otherwise with its defaults.

The workload extracts records: each chat request gives a short text and asks for its record as JSON under a schema
(`response_format` json_schema, strict), greedy, 160 tokens at most; the schemas' keys are what a grammar forces.
At concurrency 1 each request's time from sending to its last token is measured (the tokens are the same with and
without, so time per request is the figure), and the time per output token; then 32 requests at concurrency 4,
32 at 8 and 48 at 16, output tokens a second.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from rill.bench.features.speculative import MODEL, run
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server

ORDER = {"type": "object", "additionalProperties": False,
         "properties": {"customer_name": {"type": "string"}, "shipping_address": {"type": "string"},
                        "order_quantity": {"type": "integer"}, "is_priority_delivery": {"type": "boolean"}},
         "required": ["customer_name", "shipping_address", "order_quantity", "is_priority_delivery"]}
PERSON = {"type": "object", "additionalProperties": False,
          "properties": {"full_name": {"type": "string"}, "year_of_birth": {"type": "integer"},
                         "country_of_residence": {"type": "string"},
                         "occupation": {"type": "string", "enum": ["engineer", "teacher", "doctor", "other"]},
                         "programming_languages": {"type": "array", "items": {"type": "string"}}},
          "required": ["full_name", "year_of_birth", "country_of_residence", "occupation", "programming_languages"]}
THROUGHPUT = ((4, 32), (8, 32), (16, 48))  # (concurrency, requests)
TEXTS = [
    (ORDER, "Bob Smith orders 3 lamps, to be sent fast to 1 Main Street, Springfield."),
    (PERSON, "Ada Lovelace, born in 1815 in London, wrote the first published program; she lived in England."),
    (ORDER, "Alice Jones wants 12 chairs delivered to 5 Oak Road, Leeds; there is no hurry."),
    (PERSON, "Linus, a Finnish engineer born in 1969, writes C and some Python, and lives in the United States."),
    (ORDER, "Please send 40 boxes of pens to Carla Ruiz, Calle Mayor 7, Madrid, as a priority order."),
    (PERSON, "Grace Hopper (born 1906), an American doctor of mathematics, worked on COBOL and FORTRAN."),
    (ORDER, "Deliver one piano to Dmitri Ivanov at 22 Nevsky Prospekt, normal delivery."),
    (PERSON, "Mei Chen teaches physics in Singapore; she was born in 1988 and codes in Julia and R."),
]


def bodies(num: int) -> list[dict]:
    out = []
    for i in range(num):
        schema, text = TEXTS[i % len(TEXTS)]
        out.append({"messages": [{"role": "user", "content": f"{text}\n\nWrite its record as JSON."}],
                    "max_tokens": 160, "response_format": {"type": "json_schema", "json_schema": {
                        "name": "record", "schema": schema, "strict": True}}})
    return out


def measure(flags: list[str], log: Path, quick: bool) -> dict:
    each = bodies(2 if quick else len(TEXTS))
    with rill_server(*flags, log_path=log).wait_ready(900) as srv:
        url = srv.base_url
        asyncio.run(run(url, each[:2], 1))  # warm up: the schemas compile, the steps' shapes are seen
        single = asyncio.run(run(url, each, 1))
        texts = [httpx.post(f"{url}/v1/chat/completions", timeout=600, json={
            "model": MODEL, "temperature": 0, **b}).json()["choices"][0]["message"]["content"] for b in each]
        tok_s = {}
        for concurrency, num in THROUGHPUT:
            started = time.perf_counter()
            results = asyncio.run(run(url, bodies(8 if quick else num), concurrency))
            tok_s[concurrency] = sum(r["tokens"] for r in results) / (time.perf_counter() - started)
        stats = httpx.get(f"{url}/stats", timeout=30).json()
    return {"request_s": [r["times"][-1] - r["times"][0] for r in single],
            "tpot_ms": 1000 * statistics.mean((r["times"][-1] - r["times"][1]) / (r["tokens"] - 1) for r in single),
            "tokens": [r["tokens"] for r in single], "texts": texts, "output_tok_s": tok_s,
            "dtype": stats.get("dtype"), "jump_forward_tokens": stats.get("num_jump_forward_tokens", 0),
            "jump_forward_accepted": stats.get("num_jump_forward_accepted", 0)}


def report_markdown(report: dict) -> str:
    off, on = report["off"], report["on"]
    mean_off, mean_on = statistics.mean(off["request_s"]), statistics.mean(on["request_s"])
    ratios = [b / a for a, b in zip(off["request_s"], on["request_s"])]
    rows = [["extract a record, concurrency 1: time per request (mean)", f"{1000 * mean_off:.0f} ms",
             f"{1000 * mean_on:.0f} ms", f"{mean_on / mean_off:.2f}x"],
            ["the same: time per output token", f"{off['tpot_ms']:.2f} ms", f"{on['tpot_ms']:.2f} ms",
             f"{on['tpot_ms'] / off['tpot_ms']:.2f}x"],
            *([f"{num} requests at concurrency {c}: output tok/s", f"{off['output_tok_s'][c]:.0f}",
               f"{on['output_tok_s'][c]:.0f}", f"{on['output_tok_s'][c] / off['output_tok_s'][c]:.2f}x"]
              for c, num in THROUGHPUT)]
    same = sum(a == b for a, b in zip(off["texts"], on["texts"]))
    machine = report["machine"]
    return (f"# Jump-forward drafts in structured outputs against none\n\n`{report['command']}` on "
            f"{machine.get('cpu_model', '?')} ({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), "
            f"{report['date']}; the bundled model ({on['dtype']}, `--model-impl {report.get('model_impl', 'auto')}`), "
            f"`rill serve` with its defaults "
            f"(--jump-forward-tokens 8) and with --jump-forward-tokens 0; {len(ratios)} record extractions under two "
            f"JSON schemas.\n\n"
            + table(["figure", "off", "jump-forward", "on / off"], rows)
            + f"\n\nPer request, time with / without: {', '.join(f'{r:.2f}' for r in ratios)} (median "
              f"{statistics.median(ratios):.2f}). Forced draft tokens {on['jump_forward_tokens']}, of which the "
              f"model accepted {on['jump_forward_accepted']}; output tokens at concurrency 1: {sum(on['tokens'])} "
              f"(off: {sum(off['tokens'])}). Greedy texts the same with and without: {same} of {len(on['texts'])}.\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true", help="two requests, eager servers: checks the bench runs")
    ap.add_argument("--model-impl", default="auto", choices=["auto", "transformers"],
                    help="transformers: the bundled model on the paged transformers route (Gemma's, GPT-OSS's, ...)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-jump-forward-"))
    flags = (["--enforce-eager"] if args.quick else []) + ["--model-impl", args.model_impl]
    report = {**provenance("rill.bench.features.jump_forward", argv, args.machine), "model_impl": args.model_impl,
              "off": measure([*flags, "--jump-forward-tokens", "0"], tmp / "off.log", args.quick),
              "on": measure(flags, tmp / "on.log", args.quick)}
    md = report_markdown(report)
    if not args.quick:
        route = "" if args.model_impl == "auto" else f"{args.model_impl}-"
        save_results(args.out / f"jump_forward-{route}{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
