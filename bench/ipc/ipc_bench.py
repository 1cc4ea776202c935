"""Microbenchmark: token ids between two processes by ZeroMQ frames alone vs ZeroMQ + ShmRing.

`python -m rill.bench.ipc.ipc_bench [--quick]`. This process sends, a spawned child receives; each
message pays the whole path: build, encode, send, recv, decode, ids out as Python lists, and
for a step the per-request slicing `asgi/engine_link/client.py` does. How the ids travel:

- zmq_list: inline msgpack lists, the protocol's `Submit.prompts` / `StepOutputs.ids`: what
  the serving path sends
- shm_ring: bench/ipc/shm_ring.py's ring (sizes in bench/ipc/ipc_variants.py), a ShmSlice in the message
- zmq_bytes: raw int32 (float32) bytes in a msgpack bin field, one frame
- zmq_multipart: a header frame + each numpy array as its own frame (send_multipart copy=False)

Payloads: `prompt_4k` is a real Submit; `step_256` a real StepOutputs (256 RequestDeltas of 1
id; the sender starts from the output thread's flat list). `step_256_top20` adds top-20
logprobs, which the protocol lacks: a bench-local StepLogprobs carries 256 x 21 int32 ids and
256 x 21 float32 logprobs from numpy arrays (as off a torch top-k): `zmq_list` as list[int] +
list[float], `shm_ring` both in the one output ring (logprobs as their raw 32-bit patterns,
two ShmSlices), `zmq_bytes`/`zmq_multipart` as raw buffers. The receiver makes Python lists
of both (what JSON encoding needs). Sync sockets on both sides (the worker's zmq.asyncio adds
the same to every variant). `stream` trials keep 16 messages in flight (throughput; each
side's CPU per message, its zmq I/O thread included); `ping` trials send one message and wait
for a 1-frame ack. Variants rotate within each round, so drift hits them alike.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path

import zmq

from rill.bench.ipc.ipc_variants import (
    BASELINE,
    NUM_MSGS,
    NUM_VERSIONS,
    OUTPUT_RING_IDS,
    PAYLOADS,
    PROMPT_RING_IDS,
    QUICK_NUM_MSGS,
    RATIO_KEYS,
    STREAM_WINDOW,
    VARIANTS,
    Payload,
    decode_control,
    digest,
    encode,
    receive,
    send,
)
from rill.bench.ipc.shm_ring import ShmRing, segment_name
from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.ipc.channels import make_socket


def _receiver_main(address_dir: str, ring_specs: dict[str, tuple[str, int]], parent_pid: int) -> None:
    ctx = zmq.Context()
    ctrl, data = (make_socket(ctx, zmq.PULL, f"ipc://{address_dir}/{n}", bind=False) for n in ("ctrl", "data"))
    acks = make_socket(ctx, zmq.PUSH, f"ipc://{address_dir}/acks", bind=False)
    data.setsockopt(zmq.RCVTIMEO, 30_000)  # a dead parent must not leave us blocked for ever
    rings = {role: ShmRing(seg, capacity, create=False) for role, (seg, capacity) in ring_specs.items()}
    try:
        while os.getppid() == parent_pid:
            if not ctrl.poll(1000):
                continue
            variant, payload_name, num_msgs, ack_every, verify = decode_control(ctrl.recv())
            if num_msgs == 0:
                return
            payload = PAYLOADS[payload_name]
            ring = rings["prompts" if payload.is_prompt else "outputs"]
            acks.send(b"ready")
            crc, cpu0_s = 0, time.process_time()
            for count in range(1, num_msgs + 1):
                ids, lps = receive(data, ring, variant, payload)
                if verify:
                    crc = digest(crc, ids, lps)
                if count % ack_every == 0 or count == num_msgs:
                    acks.send(count.to_bytes(8, "little"))
            acks.send(encode((time.process_time() - cpu0_s, crc)))
    finally:
        for ring in rings.values():
            ring.close()
        ctx.destroy(linger=0)


class Link:
    """This process's sockets and rings (it owns both rings), and the spawned receiver."""

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="rill-ipc-bench-")
        run_id = str(os.getpid())  # rill_<pid>_*: remove_stale_segments sweeps them if we die
        specs = {"prompts": (segment_name(run_id, "bench-prompts"), PROMPT_RING_IDS),
                 "outputs": (segment_name(run_id, "bench-outputs"), OUTPUT_RING_IDS)}
        self.rings = {role: ShmRing(seg, capacity, create=True) for role, (seg, capacity) in specs.items()}
        self.ctx = zmq.Context()
        self.ctrl, self.data = (make_socket(self.ctx, zmq.PUSH, f"ipc://{self.tmp.name}/{n}", bind=True)
                                for n in ("ctrl", "data"))
        self.acks = make_socket(self.ctx, zmq.PULL, f"ipc://{self.tmp.name}/acks", bind=True)
        self.acks.setsockopt(zmq.RCVTIMEO, 60_000)
        self.child = mp.get_context("spawn").Process(target=_receiver_main, args=(self.tmp.name, specs, os.getpid()),
                                                     daemon=True)
        self.child.start()

    def trial(self, variant: str, payload: Payload, num_msgs: int, window: int, verify: bool = False) -> dict:
        self.ctrl.send(encode((variant, payload.name, num_msgs, max(1, window // 2), verify)))
        self.acks.recv()  # the receiver is in its loop: its start-up is not timed
        ring = self.rings["prompts" if payload.is_prompt else "outputs"]
        acked, start_s, cpu0_s = 0, time.perf_counter(), time.process_time()
        for i in range(num_msgs):
            while i - acked >= window:
                acked = int.from_bytes(self.acks.recv(), "little")
            num_bytes = send(self.data, ring, variant, payload, i)
        while acked < num_msgs:
            acked = int.from_bytes(self.acks.recv(), "little")
        wall_s, cpu_s = time.perf_counter() - start_s, time.process_time() - cpu0_s
        receiver_cpu_s, digest = decode_control(self.acks.recv())
        return {"wall_us": 1e6 * wall_s / num_msgs, "sender_cpu_us": 1e6 * cpu_s / num_msgs,
                "receiver_cpu_us": 1e6 * receiver_cpu_s / num_msgs, "digest": digest, "wire_bytes": num_bytes}

    def close(self) -> None:
        self.ctrl.send(encode(("", "", 0, 1, False)))
        self.child.join(10)
        if self.child.is_alive():
            self.child.kill()
        self.ctx.destroy(linger=0)
        for ring in self.rings.values():
            ring.close()
        self.tmp.cleanup()


def run(rounds: int, num_msgs: dict[str, int], variants: tuple[str, ...] = VARIANTS) -> dict:
    link = Link()
    try:
        n = 2 * NUM_VERSIONS  # correctness first, untimed: every variant delivers the same ids
        ok = {(pl.name, v): link.trial(v, pl, n, STREAM_WINDOW, verify=True)["digest"] == pl.digest(n)
              for pl in PAYLOADS.values() for v in variants}
        samples: dict = {key: [] for key in ok}
        for r in range(-1, rounds):  # round -1 warms every path up and is dropped
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for payload in PAYLOADS.values():
                n = num_msgs[payload.name]
                for v in order:
                    stream, ping = link.trial(v, payload, n, STREAM_WINDOW), link.trial(v, payload, max(4, n // 4), 1)
                    if r >= 0:
                        samples[(payload.name, v)].append({**stream, "ping_rtt_us": ping["wall_us"]})
    finally:
        link.close()
    return {pl.name: summarize(pl, {v: samples[(pl.name, v)] for v in variants}, ok) for pl in PAYLOADS.values()}


def summarize(payload: Payload, rows_by_variant: dict[str, list[dict]], ok: dict) -> dict:
    per_variant = {}
    for v, rows in rows_by_variant.items():
        med = {key: statistics.median(row[key] for row in rows)
               for key in ("wall_us", "sender_cpu_us", "receiver_cpu_us", "ping_rtt_us")}
        per_variant[v] = {
            "msgs_per_s": 1e6 / med["wall_us"], "us_per_msg": med["wall_us"],
            "sender_cpu_us_per_msg": med["sender_cpu_us"], "receiver_cpu_us_per_msg": med["receiver_cpu_us"],
            "cpu_us_per_msg": med["sender_cpu_us"] + med["receiver_cpu_us"], "ping_rtt_us": med["ping_rtt_us"],
            "wire_bytes": rows[0]["wire_bytes"], "ids_identical": ok[(payload.name, v)],
            "us_per_msg_rounds": [round(row["wall_us"], 2) for row in rows]}
    base = per_variant[BASELINE]
    ratios = {f"{v}/{BASELINE}": {k: per_variant[v][k] / base[k] for k in RATIO_KEYS}
              for v in per_variant if v != BASELINE}
    return {"description": payload.description, "num_ids": payload.num_ids,
            "num_float32": payload.num_ids if payload.has_logprobs else 0, "variants": per_variant, "ratios": ratios}


def verdicts(results: dict) -> list[str]:
    """One line per payload: the variants by CPU per message, and shm against plain frames."""
    lines = []
    for name, res in results.items():
        ranked = sorted(res["variants"], key=lambda v: res["variants"][v]["cpu_us_per_msg"])
        x = res["ratios"][f"shm_ring/{BASELINE}"]
        lines.append(f"- **{name}**: by CPU per message, `{'` < `'.join(ranked)}`. shm_ring/{BASELINE}: "
                     f"{x['us_per_msg']:.2f}x time per message, {x['cpu_us_per_msg']:.2f}x CPU, "
                     f"{x['ping_rtt_us']:.2f}x round trip.")
    return lines


def markdown(report: dict) -> str:
    m = report["machine"]
    out = [f"# IPC microbenchmark ({m['name']})", "", f"- command: `{report['command']}`", f"- date: {report['date']}",
           f"- machine: {m['cpu_count']} CPUs, {m['cpu_model']}, torch {m['torch']}, pyzmq {m['pyzmq']}, "
           f"msgspec {m['msgspec']}, load {m['load_avg_1m_start']:.2f} at start",
           f"- {report['params']['rounds']} interleaved rounds, medians; messages per trial "
           f"{report['params']['num_msgs']}", "",
           f"`x` columns are ratios to `{BASELINE}` (below 1 is cheaper). us/msg: pipelined wall time per message "
           "(the slower side bounds it); CPU: sender + receiver CPU time; rtt: one message and a 1-frame ack.", ""]
    for name, res in report["results"].items():
        rows = [[v, f"{r['msgs_per_s']:,.0f}", f"{r['us_per_msg']:.1f}", f"{r['sender_cpu_us_per_msg']:.1f}",
                 f"{r['receiver_cpu_us_per_msg']:.1f}", f"{r['ping_rtt_us']:.1f}", f"{r['wire_bytes']:,}",
                 *(f"{res['ratios'].get(f'{v}/{BASELINE}', dict.fromkeys(RATIO_KEYS, 1.0))[k]:.2f}"
                   for k in RATIO_KEYS), r["ids_identical"]] for v, r in res["variants"].items()]
        out += [f"## {name}: {res['description']}", "", table(
            ["variant", "msgs/s", "us/msg", "sender CPU us", "receiver CPU us", "rtt us", "wire bytes",
             "x us/msg", "x CPU", "x rtt", "ids ok"], rows)]
    out += ["## Conclusion (from these numbers)", "", *report["conclusion"], "",
            "## How it is measured", "", *__doc__.splitlines()[2:]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.ipc.ipc_bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="40 messages a trial, 2 rounds: checks that it runs")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)")
    ap.add_argument("--machine", default=None, help="machine name for the result file name (default: hostname)")
    ap.add_argument("--out", type=Path, default=None, help="the .json path (the .md goes beside it)")
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 5)
    num_msgs = QUICK_NUM_MSGS if args.quick else NUM_MSGS
    report = {"benchmark": "ipc_bench", **provenance("rill.bench.ipc.ipc_bench", argv, args.machine),
              "params": {"rounds": rounds, "num_msgs": num_msgs, "quick": args.quick, "stream_window": STREAM_WINDOW,
                         "variants": list(VARIANTS), "baseline": BASELINE},
              "results": run(rounds, num_msgs)}
    report["conclusion"] = verdicts(report["results"])
    out = args.out or Path(f"bench/results/ipc_bench-{report['machine']['name']}.json")
    save_results(out, report, markdown(report))
    print(markdown(report))
    return report


if __name__ == "__main__":
    main()
