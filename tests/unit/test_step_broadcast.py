"""The step broadcast between real spawned processes: order and content, split messages,
back-pressure, the segment's removal, and the gloo baseline."""
from __future__ import annotations

import hashlib
import multiprocessing as mp
import random
import socket
import threading
import time

import pytest

from rill.engine_proc.parallel.step_broadcast import SHM_DIR, GlooBroadcast, ShmBroadcast

CTX = mp.get_context("spawn")
TIMEOUT_S = 10  # every wait is bounded: a hang fails the test instead of stalling the run


def message(i: int) -> bytes:
    """Message i: varied sizes (empty, tiny, one full slot of 4 KiB, several slots), varied bytes."""
    size = [0, 1, 100, 4096, 4097, 3 * 4096 + 17, 50_000][i % 7] + i
    return random.Random(i).randbytes(size)


def _read_and_digest(reader, num_msgs: int, results) -> None:
    got = [hashlib.sha256(reader.recv(timeout=TIMEOUT_S)).hexdigest() for _ in range(num_msgs)]
    reader.close()
    results.put((reader.index, got))


def _read_on_signal(reader, go, num_msgs: int, results) -> None:
    assert go.wait(TIMEOUT_S)
    results.put([reader.recv(timeout=TIMEOUT_S) for _ in range(num_msgs)])
    reader.close()


def _join(procs) -> None:
    for proc in procs:
        proc.join(TIMEOUT_S)
        if proc.is_alive():
            proc.kill()
    assert [proc.exitcode for proc in procs] == [0] * len(procs)


@pytest.fixture
def make_broadcast():
    made = []

    def make(**kwargs) -> ShmBroadcast:
        made.append(ShmBroadcast.create("rill_test_step", ctx=CTX, **kwargs))
        return made[-1]

    yield make
    for broadcast in made:
        broadcast.close()


def test_two_readers_get_every_message_in_order_and_intact(make_broadcast):
    broadcast = make_broadcast(num_readers=2, slot_bytes=4096, num_slots=4)
    results = CTX.Queue()
    procs = [CTX.Process(target=_read_and_digest, args=(broadcast.reader(i), 200, results)) for i in range(2)]
    for proc in procs:
        proc.start()
    for i in range(200):
        broadcast.publish(message(i), timeout=TIMEOUT_S)
    expected = [hashlib.sha256(message(i)).hexdigest() for i in range(200)]
    got = dict(results.get(timeout=TIMEOUT_S) for _ in procs)
    _join(procs)
    assert got == {0: expected, 1: expected}


def test_a_message_of_three_and_a_half_slots_is_reassembled(make_broadcast):
    broadcast = make_broadcast(num_readers=1, slot_bytes=1000, num_slots=2)  # fewer slots than chunks
    big, small = random.Random(7).randbytes(3500), b"after"
    go, results = CTX.Event(), CTX.Queue()
    proc = CTX.Process(target=_read_on_signal, args=(broadcast.reader(0), go, 2, results))
    proc.start()
    go.set()
    broadcast.publish(big, timeout=TIMEOUT_S)
    broadcast.publish(small, timeout=TIMEOUT_S)
    assert results.get(timeout=TIMEOUT_S) == [big, small]
    _join([proc])


def test_a_reader_behind_by_every_slot_holds_the_writer_back(make_broadcast):
    broadcast = make_broadcast(num_readers=1, slot_bytes=64, num_slots=2)
    go, results = CTX.Event(), CTX.Queue()
    proc = CTX.Process(target=_read_on_signal, args=(broadcast.reader(0), go, 3, results))
    proc.start()
    broadcast.publish(b"one", timeout=TIMEOUT_S)
    broadcast.publish(b"two", timeout=TIMEOUT_S)
    with pytest.raises(TimeoutError):  # a third would overwrite unread data
        broadcast.publish(b"three", timeout=0.2)
    third = threading.Thread(target=broadcast.publish, args=(b"three",), kwargs={"timeout": TIMEOUT_S})
    third.start()
    time.sleep(0.3)
    assert third.is_alive()  # still blocked: the reader has read nothing
    go.set()
    third.join(TIMEOUT_S)
    assert not third.is_alive()
    assert results.get(timeout=TIMEOUT_S) == [b"one", b"two", b"three"]
    _join([proc])


def test_close_unlinks_the_segment_and_is_idempotent():
    broadcast = ShmBroadcast.create("rill_test_step", 1, ctx=CTX, slot_bytes=64, num_slots=2)
    other = ShmBroadcast.create("rill_test_step", 1, ctx=CTX, slot_bytes=64, num_slots=2)
    assert broadcast.name != other.name  # unique per instance, even within one process
    assert (SHM_DIR / broadcast.name).exists()
    broadcast.close()
    other.close()
    broadcast.close()
    assert not (SHM_DIR / broadcast.name).exists() and not (SHM_DIR / other.name).exists()
    with pytest.raises(RuntimeError):
        broadcast.publish(b"late")


def _gloo_rank(rank: int, port: int, num_msgs: int, results) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
    try:
        broadcast = GlooBroadcast()
        if rank == 0:
            for i in range(num_msgs):
                broadcast.publish(message(i))
        else:
            results.put([hashlib.sha256(broadcast.recv()).hexdigest() for _ in range(num_msgs)])
    finally:
        dist.destroy_process_group()


def test_gloo_broadcast_round_trips():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = CTX.Queue()
    procs = [CTX.Process(target=_gloo_rank, args=(rank, port, 20, results)) for rank in range(2)]
    for proc in procs:
        proc.start()
    got = results.get(timeout=30)  # two torch imports on two cores
    _join(procs)
    assert got == [hashlib.sha256(message(i)).hexdigest() for i in range(20)]
