"""The wire formats the IPC microbenchmark compares: message types, payloads, send and receive.

See bench/ipc/ipc_bench.py for what each variant means and how the trials run.
"""
from __future__ import annotations

import zlib

import msgspec
import numpy as np
import zmq

from rill.bench.ipc.shm_ring import ShmRing, ShmSlice
from rill.ipc import protocol as p

VARIANTS = ("zmq_list", "shm_ring", "zmq_bytes", "zmq_multipart")
BASELINE = "zmq_list"
STREAM_WINDOW = 16  # messages in flight: 16 logprob steps (172k ids) fit the 262k-id output ring
NUM_VERSIONS = 4  # distinct contents cycled through, so a stale or misplaced read shows
NUM_MSGS = {"prompt_4k": 2000, "step_256": 4000, "step_256_top20": 800}  # ~0.2-0.5 s a trial
QUICK_NUM_MSGS = dict.fromkeys(NUM_MSGS, 40)
RATIO_KEYS = ("us_per_msg", "cpu_us_per_msg", "ping_rtt_us")
PARAMS = p.SamplingParams(max_tokens=256, temperature=0.7, top_p=0.95, seed=1234)


# Ring sizes as the serving path had them when it used rings (4 MiB prompts, 1 MiB outputs).
PROMPT_RING_IDS = 1 << 20
OUTPUT_RING_IDS = 1 << 18


class SubmitShm(msgspec.Struct, tag="Submit", array_like=True, gc=False):
    """`Submit` with its prompt ids in the worker's ring instead of inline."""

    req_id: str
    worker_id: str
    params: p.SamplingParams
    prompt: ShmSlice


class StepShm(msgspec.Struct, tag="StepOutputs", array_like=True, gc=False):
    """`StepOutputs` with the step's ids in the worker's ring instead of inline."""

    deltas: list[p.RequestDelta]
    ids: ShmSlice


class SubmitBytes(msgspec.Struct, tag=True, array_like=True, gc=False):
    req_id: str
    worker_id: str
    params: p.SamplingParams
    prompt_bytes: bytes  # int32


class StepBytes(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    deltas: list[p.RequestDelta]
    ids_bytes: bytes  # int32
    logprobs_bytes: bytes = b""  # float32


class StepLogprobs(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    """`StepOutputs` plus the logprobs the protocol does not carry yet: in the ring or inline."""

    deltas: list[p.RequestDelta]
    ids: ShmSlice | None = None
    inline_ids: list[int] | None = None
    logprobs: ShmSlice | None = None
    inline_logprobs: list[float] | None = None


encode = msgspec.msgpack.Encoder().encode
_decoders = {t: msgspec.msgpack.Decoder(t).decode for t in (SubmitBytes, StepBytes, StepLogprobs, SubmitShm, StepShm)}
decode_control = msgspec.msgpack.Decoder().decode  # trial orders and results: plain arrays


class Payload:
    """One message kind with NUM_VERSIONS ready-made contents: nothing is generated while timed."""

    def __init__(self, name: str, description: str, num_ids: int, width: int = 0, logprobs: bool = False):
        rng = np.random.default_rng(num_ids)
        self.name, self.description, self.num_ids = name, description, num_ids
        self.is_prompt, self.width, self.has_logprobs = width == 0, width, logprobs
        self.deltas = [p.RequestDelta(f"cmpl-{i:032x}-0", num_new=1) for i in range(num_ids // max(width, 1))]
        self.ids = [rng.integers(0, 49152, num_ids, dtype=np.int32) for _ in range(NUM_VERSIONS)]
        self.logprobs = [-rng.exponential(2.0, num_ids).astype(np.float32) for _ in range(NUM_VERSIONS)]
        # The sender holds what the tokenizer and the sampler give: Python lists; top-k
        # logprobs would come off a torch tensor, so those stay arrays.
        self.source = [ids if logprobs else ids.tolist() for ids in self.ids]

    def digest(self, num_msgs: int) -> int:
        crc = 0
        for i in range(num_msgs):
            v = i % NUM_VERSIONS
            crc = digest(crc, self.ids[v], self.logprobs[v] if self.has_logprobs else None)
        return crc


PAYLOADS = {pl.name: pl for pl in (
    Payload("prompt_4k", "Submit of a 4,096-token prompt (worker -> engine)", 4096),
    Payload("step_256", "StepOutputs of a decode step, 256 RequestDeltas of 1 id (engine -> worker)", 256, 1),
    Payload("step_256_top20", "that step with top-20 logprobs: 256 x 21 int32 ids + 256 x 21 float32", 256 * 21,
            21, logprobs=True),
)}


def digest(crc: int, ids, logprobs) -> int:
    crc = zlib.crc32(np.asarray(ids, dtype=np.int32).tobytes(), crc)
    return crc if logprobs is None else zlib.crc32(np.asarray(logprobs, dtype=np.float32).tobytes(), crc)


def _ring_write(ring: ShmRing, values) -> ShmSlice:
    where = ring.write(values)
    if where is None:  # STREAM_WINDOW is sized so that this never happens
        raise RuntimeError(f"ring {ring.name} full: STREAM_WINDOW too large for its capacity")
    return where


def send(sock: zmq.Socket, ring: ShmRing, variant: str, payload: Payload, i: int) -> int:
    """Build, encode and send message i; returns its bytes on the socket (not those in the ring)."""
    src, deltas, req_id = payload.source[i % NUM_VERSIONS], payload.deltas, f"cmpl-{i:032x}-0"
    lps = payload.logprobs[i % NUM_VERSIONS]
    if variant == "zmq_list" and payload.is_prompt:
        frames = [p.input_encoder.encode(p.Submit([req_id], "1234", PARAMS, [src]))]
    elif variant == "zmq_list" and payload.has_logprobs:
        frames = [encode(StepLogprobs(deltas, inline_ids=src.tolist(), inline_logprobs=lps.tolist()))]
    elif variant == "zmq_list":
        frames = [p.output_encoder.encode(p.StepOutputs(deltas, src))]
    elif variant == "shm_ring" and payload.is_prompt:
        frames = [encode(SubmitShm(req_id, "1234", PARAMS, _ring_write(ring, src)))]
    elif variant == "shm_ring" and payload.has_logprobs:  # both arrays in the one ring, logprobs as raw bits
        ids_at, lps_at = _ring_write(ring, src), _ring_write(ring, lps.view(np.int32))
        frames = [encode(StepLogprobs(deltas, ids=ids_at, logprobs=lps_at))]
    elif variant == "shm_ring":
        frames = [encode(StepShm(deltas, _ring_write(ring, src)))]
    elif variant == "zmq_bytes" and payload.is_prompt:
        frames = [encode(SubmitBytes(req_id, "1234", PARAMS, np.array(src, np.int32).tobytes()))]
    elif variant == "zmq_bytes":
        frames = [encode(StepBytes(deltas, np.asarray(src, np.int32).tobytes(),
                                    lps.tobytes() if payload.has_logprobs else b""))]
    elif payload.is_prompt:
        frames = [p.input_encoder.encode(p.Submit([req_id], "1234", PARAMS, [[]])), np.array(src, np.int32)]
    else:
        arrays = [src, lps] if payload.has_logprobs else [np.array(src, np.int32)]
        frames = [p.output_encoder.encode(p.StepOutputs(deltas, [])), *arrays]
    if len(frames) == 1:
        sock.send(frames[0])
    else:  # hands the arrays' buffers over without a copy (pyzmq copies frames under 64 KiB anyway)
        sock.send_multipart(frames, copy=False)
    return sum(memoryview(f).nbytes for f in frames)


def receive(sock: zmq.Socket, ring: ShmRing, variant: str, payload: Payload):
    """One message -> (ids, logprobs or None) as Python lists, then sliced per request."""
    lps = None
    if variant == "zmq_multipart":
        frames = sock.recv_multipart(copy=False)
        msg = (p.input_decoder if payload.is_prompt else p.output_decoder).decode(frames[0].buffer)
        ids = np.frombuffer(frames[1].buffer, np.int32).tolist()
        if payload.has_logprobs:
            lps = np.frombuffer(frames[2].buffer, np.float32).tolist()
    elif variant == "zmq_bytes":
        msg = _decoders[SubmitBytes if payload.is_prompt else StepBytes](sock.recv(copy=False).buffer)
        ids = np.frombuffer(msg.prompt_bytes if payload.is_prompt else msg.ids_bytes, np.int32).tolist()
        if payload.has_logprobs:
            lps = np.frombuffer(msg.logprobs_bytes, np.float32).tolist()
    elif payload.is_prompt and variant == "shm_ring":
        msg = _decoders[SubmitShm](sock.recv(copy=False).buffer)
        ids = ring.read(msg.prompt).tolist()
    elif payload.is_prompt:  # as engine_proc/io_threads.py
        msg = p.input_decoder.decode(sock.recv(copy=False).buffer)
        ids = msg.prompts[0]
    elif payload.has_logprobs:
        msg = _decoders[StepLogprobs](sock.recv(copy=False).buffer)
        ids = ring.read(msg.ids).tolist() if msg.ids is not None else msg.inline_ids
        lps = (ring.read(msg.logprobs).view(np.float32).tolist() if msg.logprobs is not None
               else msg.inline_logprobs)
    elif variant == "shm_ring":
        msg = _decoders[StepShm](sock.recv(copy=False).buffer)
        ids = ring.read(msg.ids).tolist()
    else:  # as asgi/engine_link/client.py
        msg = p.output_decoder.decode(sock.recv(copy=False).buffer)
        ids = msg.ids
    if not payload.is_prompt:  # each request's slice, where the engine client puts it in a mailbox
        start, slices = 0, []
        for delta in msg.deltas:
            end = start + delta.num_new * payload.width
            slices.append((ids[start:end], lps[start:end]) if lps is not None else ids[start:end])
            start = end
    return ids, lps
