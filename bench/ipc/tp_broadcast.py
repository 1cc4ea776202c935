"""`python -m rill.bench.ipc.tp_broadcast [--quick]`: one step's batch from the engine (rank 0) to the other
tensor-parallel ranks on this machine: engine_proc/parallel/step_broadcast.py's ShmBroadcast
(a /dev/shm ring, semaphore wake-ups) against GlooBroadcast (torch.distributed gloo broadcasts).

Sizes: 2 KB (a decode step of 32 sequences), 32 KB (a 2048-token prefill), 1 MiB (rare; exactly
one ShmBroadcast slot at its default size). The writer stamps `time.perf_counter_ns()` (CLOCK_MONOTONIC,
one clock for every process) into each message as it publishes and sleeps 2 ms between messages,
as real steps are apart; each reader takes the clock again as `recv` returns, then checks the
sequence number and every byte (not timed). One-way latency is the difference; with several
readers, a message's latency is its slowest reader's (a step starts when the last rank has it).
The first messages of each size warm the path up and are dropped. Readers are spawned processes;
the shm writer is this process, the gloo writer a spawned rank 0 (gloo needs a process group).
The writer hands both transports a bytearray, so GlooBroadcast skips the copy it makes of
read-only bytes (the engine's msgpack): the baseline is measured at its cheapest.
Reader CPU per message is each reader's process CPU time (its threads included: gloo's I/O
thread) over the run, less the byte check, averaged over readers.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import random
import socket
import statistics
import struct
import time
from pathlib import Path

from rill.bench.serving.markdown import table
from rill.bench.serving.provenance import provenance, save_results
from rill.engine_proc.parallel.step_broadcast import GlooBroadcast, ShmBroadcast

SIZES = {"2KB": 2048, "32KB": 32 * 1024, "1MiB": 1 << 20}
SIZE_NOTES = {"2KB": "a decode step of 32 sequences", "32KB": "a 2048-token prefill", "1MiB": "rare"}
TRANSPORTS = ("shm", "gloo")
NUM_MSGS, QUICK_NUM_MSGS = 1000, 20  # timed messages per size
NUM_WARMUP, QUICK_NUM_WARMUP = 20, 3
GAP_S = 0.002
TIMEOUT_S = 60  # any wait: a dead process fails the run instead of hanging it
_STAMP = struct.Struct("<qI")  # perf_counter_ns at publish, the message's sequence number


def filler(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def _write(publish, sizes: list[int], num_msgs: int, num_warmup: int) -> None:
    for size in sizes:
        buf = bytearray(filler(size))
        for seq in range(num_warmup + num_msgs):
            _STAMP.pack_into(buf, 0, time.perf_counter_ns(), seq)
            publish(buf)
            time.sleep(GAP_S)


def _read(recv, sizes: list[int], num_msgs: int, num_warmup: int) -> dict:
    """Per size: the timed messages' latencies (ns), how many arrived intact, CPU us per message."""
    out = {}
    for size in sizes:
        expected = memoryview(filler(size))[_STAMP.size :]
        latency_ns, num_intact, check_s = [], 0, 0.0
        cpu0_s = time.process_time()
        for seq in range(num_warmup + num_msgs):
            msg = recv()
            now_ns = time.perf_counter_ns()
            check0_s = time.thread_time()
            stamp_ns, got_seq = _STAMP.unpack_from(msg)
            if seq >= num_warmup:
                latency_ns.append(now_ns - stamp_ns)
            num_intact += len(msg) == size and got_seq == seq and memoryview(msg)[_STAMP.size :] == expected
            check_s += time.thread_time() - check0_s
        cpu_s = time.process_time() - cpu0_s - check_s
        out[size] = {"latency_ns": latency_ns, "num_intact": num_intact,
                     "cpu_us_per_msg": 1e6 * cpu_s / (num_warmup + num_msgs)}
    return out


def _shm_reader_main(reader, sizes, num_msgs, num_warmup, barrier, results) -> None:
    barrier.wait(TIMEOUT_S)
    results.put((reader.index, _read(lambda: reader.recv(timeout=TIMEOUT_S), sizes, num_msgs, num_warmup)))
    reader.close()


def _gloo_rank_main(rank, world_size, port, sizes, num_msgs, num_warmup, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=world_size, rank=rank,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    try:
        broadcast = GlooBroadcast()
        dist.barrier()
        if rank == 0:
            _write(broadcast.publish, sizes, num_msgs, num_warmup)
        else:
            results.put((rank - 1, _read(broadcast.recv, sizes, num_msgs, num_warmup)))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_transport(transport: str, num_readers: int, sizes: list[int], num_msgs: int, num_warmup: int) -> list[dict]:
    """Each reader's `_read` result, in reader order."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    broadcast = None
    if transport == "shm":
        broadcast = ShmBroadcast.create("rill_bench_tp", num_readers, ctx=ctx)
        barrier = ctx.Barrier(num_readers + 1)
        procs = [ctx.Process(target=_shm_reader_main, daemon=True,
                             args=(broadcast.reader(i), sizes, num_msgs, num_warmup, barrier, results))
                 for i in range(num_readers)]
    else:
        port = _free_port()
        procs = [ctx.Process(target=_gloo_rank_main, daemon=True,
                             args=(rank, num_readers + 1, port, sizes, num_msgs, num_warmup, results))
                 for rank in range(num_readers + 1)]
    try:
        for proc in procs:
            proc.start()
        if broadcast is not None:
            barrier.wait(TIMEOUT_S)
            _write(lambda payload: broadcast.publish(payload, timeout=TIMEOUT_S), sizes, num_msgs, num_warmup)
        by_reader = dict(results.get(timeout=TIMEOUT_S + 30 * len(sizes)) for _ in range(num_readers))
        for proc in procs:
            proc.join(TIMEOUT_S)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        if broadcast is not None:
            broadcast.close()
    return [by_reader[i] for i in range(num_readers)]


def summarize(per_reader: list[dict], size: int, num_msgs: int, num_warmup: int) -> dict:
    slowest_us = [max(lat) / 1e3 for lat in zip(*(reader[size]["latency_ns"] for reader in per_reader))]
    return {"median_us": statistics.median(slowest_us),
            "p99_us": statistics.quantiles(slowest_us, n=100, method="inclusive")[98],
            "mean_us": statistics.fmean(slowest_us), "max_us": max(slowest_us),
            "reader_cpu_us_per_msg": statistics.fmean(reader[size]["cpu_us_per_msg"] for reader in per_reader),
            "num_intact": sum(reader[size]["num_intact"] for reader in per_reader),
            "num_expected": len(per_reader) * (num_warmup + num_msgs), "num_timed": len(slowest_us)}


def run(reader_counts: list[int], num_msgs: int, num_warmup: int) -> dict:
    sizes = list(SIZES.values())
    results = {}
    for num_readers in reader_counts:
        raw = {t: run_transport(t, num_readers, sizes, num_msgs, num_warmup) for t in TRANSPORTS}
        by_size = {}
        for label, size in SIZES.items():
            row = {t: summarize(raw[t], size, num_msgs, num_warmup) for t in TRANSPORTS}
            row["gloo_over_shm"] = {k: row["gloo"][f"{k}_us"] / row["shm"][f"{k}_us"] for k in ("median", "p99")}
            by_size[label] = {"bytes": size, "note": SIZE_NOTES[label], **row}
        results[f"readers_{num_readers}"] = by_size
    return results


def markdown(report: dict) -> str:
    m, p = report["machine"], report["params"]
    out = [f"# Step broadcast to tensor-parallel ranks: ShmBroadcast vs gloo ({m['name']})", "",
           f"- command: `{report['command']}`", f"- date: {report['date']}",
           f"- machine: {m['cpu_count']} CPUs, {m['cpu_model']}, torch {m['torch']}, "
           f"load {m['load_avg_1m_start']:.2f} at start",
           f"- {p['num_msgs']} timed messages per size and transport ({p['num_warmup']} warm-up dropped), "
           f"{1000 * p['gap_s']:g} ms apart; one-way latency in microseconds", ""]
    for key, by_size in report["results"].items():
        rows = [[f"{label} ({r['note']})", f"{r['shm']['median_us']:.0f}", f"{r['shm']['p99_us']:.0f}",
                 f"{r['gloo']['median_us']:.0f}", f"{r['gloo']['p99_us']:.0f}",
                 f"{r['gloo_over_shm']['median']:.2f}x", f"{r['gloo_over_shm']['p99']:.2f}x",
                 f"{r['shm']['reader_cpu_us_per_msg']:.0f} / {r['gloo']['reader_cpu_us_per_msg']:.0f}",
                 all(r[t]["num_intact"] == r[t]["num_expected"] for t in TRANSPORTS)]
                for label, r in by_size.items()]
        out += [f"## {key.split('_')[1]} reader(s)", "", table(
            ["message", "shm median", "shm p99", "gloo median", "gloo p99", "gloo/shm median", "gloo/shm p99",
             "reader CPU us/msg shm / gloo", "all intact"], rows)]
    out += ["## How it is measured", "", *__doc__.splitlines()[4:]]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m rill.bench.ipc.tp_broadcast", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="20 messages a size, 1 reader; writes nothing unless --out")
    ap.add_argument("--machine", default=None, help="machine name recorded (default: hostname)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the .json path, the .md beside it (default bench/results/tp_broadcast-cpu.json)")
    args = ap.parse_args(argv)
    num_msgs, num_warmup = (QUICK_NUM_MSGS, QUICK_NUM_WARMUP) if args.quick else (NUM_MSGS, NUM_WARMUP)
    reader_counts = [1] if args.quick else [1, 2]
    report = {"benchmark": "tp_broadcast", **provenance("rill.bench.ipc.tp_broadcast", argv, args.machine),
              "params": {"num_msgs": num_msgs, "num_warmup": num_warmup, "gap_s": GAP_S, "quick": args.quick,
                         "sizes": SIZES, "reader_counts": reader_counts, "shm_slot_bytes": 1 << 20,
                         "shm_num_slots": 4},
              "results": run(reader_counts, num_msgs, num_warmup)}
    md = markdown(report)
    out = args.out or (None if args.quick else Path("bench/results/tp_broadcast-cpu.json"))
    if out is not None:
        save_results(out, report, md)
    print(md)
    return report


if __name__ == "__main__":
    main()
