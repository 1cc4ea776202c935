"""`python -m rill.bench.features.beam_search`: vLLM's `use_beam_search` served by `rill serve` (its defaults) against
transformers' own beam search, `generate(num_beams=4)`, in this process, on the bundled model; and against a sampled
request of the same `n` on the same server, which says what the search costs over sampling.

Eight completions prompts, n=4 beams, 32 tokens at most. One request at a time: each request's time to its whole
answer (the beam search's answer comes whole). Then the eight at once, the server's requests a second. transformers
runs one prompt at a time in float32 (its CPU default), at the machine's thread count; the served beams are compared
with its beams (equal only where the dtypes round alike: the server runs --dtype auto).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

from rill.bench.peers.hf_generate import load_model
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.bench.serving.servers import rill_server
from rill.engine_proc.model.bundled import ensure_bundled_model

MODEL = "smollm2-135m-instruct"
WIDTH, MAX_TOKENS = 4, 32
PROMPTS = [
    "The three most useful things to pack for a long hike are",
    "Translate to French: The cat sleeps on the warm windowsill.",
    "A haiku about the first snow of winter:",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The capital of Australia is",
    "Q: Why is the sky blue?\nA:",
    "Summary of the plot of Hamlet in one sentence:",
    "A good name for a small bakery in Paris would be",
]


async def timed(base_url: str, bodies: list[dict], concurrency: int) -> tuple[list[float], list[dict], float]:
    """Each request's seconds and answer, and the wall time of all, `concurrency` at a time."""
    seats = asyncio.Semaphore(concurrency)
    started = time.perf_counter()

    async def one(http, body):
        async with seats:
            t0 = time.perf_counter()
            r = await http.post("/v1/completions", json={"model": MODEL, **body})
            r.raise_for_status()
            return time.perf_counter() - t0, r.json()

    async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
        out = await asyncio.gather(*(one(http, b) for b in bodies))
    return [s for s, _ in out], [a for _, a in out], time.perf_counter() - started


def served(flags: list[str], log: Path, prompts: list[str]) -> dict:
    beam = [{"prompt": p, "n": WIDTH, "max_tokens": MAX_TOKENS, "use_beam_search": True, "return_token_ids": True}
            for p in prompts]
    sampled = [{"prompt": p, "n": WIDTH, "max_tokens": MAX_TOKENS, "temperature": 1.0, "seed": i}
               for i, p in enumerate(prompts)]
    with rill_server(*flags, log_path=log).wait_ready(900) as srv:
        asyncio.run(timed(srv.base_url, beam[:2] + sampled[:2], 1))  # warm up
        beam_s, answers, _ = asyncio.run(timed(srv.base_url, beam, 1))
        sampled_s, sampled_answers, _ = asyncio.run(timed(srv.base_url, sampled, 1))
        _, _, beam_wall = asyncio.run(timed(srv.base_url, beam, len(beam)))
        dtype = httpx.get(f"{srv.base_url}/stats", timeout=30).json()["dtype"]
    return {"beam_s": beam_s, "sampled_s": sampled_s, "beam_wall_s": beam_wall, "dtype": dtype,
            "beams": [[c["token_ids"] for c in a["choices"]] for a in answers],
            "beam_tokens": sum(a["usage"]["completion_tokens"] for a in answers),
            "sampled_tokens": sum(a["usage"]["completion_tokens"] for a in sampled_answers)}


def transformers_side(prompts: list[str]) -> dict:
    from tokenizers import Tokenizer

    model_dir = ensure_bundled_model()
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    model = load_model(model_dir, torch.float32)
    end = model.generation_config.eos_token_id
    ends = set(end if isinstance(end, list) else [end])
    seconds, beams = [], []
    with torch.no_grad():
        for i, prompt in enumerate([prompts[0], *prompts]):  # the first again: a warm-up, not counted
            ids = torch.tensor([tokenizer.encode(prompt).ids])
            t0 = time.perf_counter()
            out = model.generate(ids, num_beams=WIDTH, num_return_sequences=WIDTH, do_sample=False,
                                 max_new_tokens=MAX_TOKENS, pad_token_id=min(ends))
            if i:
                seconds.append(time.perf_counter() - t0)
                beams.append([cut(seq[ids.shape[1]:], ends) for seq in out.tolist()])
    return {"seconds": seconds, "beams": beams, "threads": torch.get_num_threads()}


def cut(tokens: list[int], ends: set[int]) -> list[int]:
    """A returned sequence up to its end token (kept), without the padding after."""
    at = next((i for i, t in enumerate(tokens) if t in ends), None)
    return tokens if at is None else tokens[: at + 1]


def report_markdown(report: dict) -> str:
    rill, hf = report["rill"], report["transformers"]
    mean = statistics.mean
    same = sum(ours == theirs for ours, theirs in zip(rill["beams"], hf["beams"]))
    best = sum(ours[0] == theirs[0] for ours, theirs in zip(rill["beams"], hf["beams"]))
    num = len(rill["beam_s"])
    rows = [["beam search, n=4, one request at a time: time per request (mean)", f"{1000 * mean(rill['beam_s']):.0f} ms",
             f"transformers generate(num_beams=4): {1000 * mean(hf['seconds']):.0f} ms",
             f"{mean(rill['beam_s']) / mean(hf['seconds']):.2f}x"],
            ["the same prompts sampled, n=4, on the same server", f"{1000 * mean(rill['sampled_s']):.0f} ms",
             f"beam search: {1000 * mean(rill['beam_s']):.0f} ms",
             f"{mean(rill['beam_s']) / mean(rill['sampled_s']):.2f}x"],
            [f"the {num} beam searches at once: requests a second", f"{num / rill['beam_wall_s']:.2f}",
             f"one at a time: {num / sum(rill['beam_s']):.2f}",
             f"{sum(rill['beam_s']) / rill['beam_wall_s']:.2f}x"]]
    machine = report["machine"]
    return (f"# Beam search: served against transformers' own\n\n`{report['command']}` on "
            f"{machine.get('cpu_model', '?')} ({machine.get('cpu_count', '?')} cores; {machine.get('cpu_flags', '')}), "
            f"{report['date']}; the bundled model, `rill serve` with its defaults ({rill['dtype']}), transformers in "
            f"float32 at {hf['threads']} threads; {num} completions prompts, n={WIDTH} beams, {MAX_TOKENS} "
            f"tokens at most.\n\n"
            + table(["figure", "Rill", "against", "ratio"], rows)
            + f"\n\nServed beams equal to transformers' (all four, token for token): {same} of {num} prompts, "
              f"the best beam {best} of {num} (the server in {rill['dtype']}, transformers in float32). Tokens answered: beam search "
              f"{rill['beam_tokens']}, sampled {rill['sampled_tokens']}.\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--machine", default=None)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true", help="two prompts, an eager server: checks the bench runs")
    args = ap.parse_args(argv)
    prompts = PROMPTS[:2] if args.quick else PROMPTS
    tmp = Path(tempfile.mkdtemp(prefix="rill-bench-beam-"))
    report = {**provenance("rill.bench.features.beam_search", argv, args.machine),
              "transformers": transformers_side(prompts),  # first: alone on the machine
              "rill": served(["--enforce-eager"] if args.quick else [], tmp / "rill.log", prompts)}
    md = report_markdown(report)
    if not args.quick:
        save_results(args.out / f"beam_search-{report['machine']['name']}.json", report, md)
    print(md)


if __name__ == "__main__":
    main()
