"""Logprobs on the wire: the raw-bytes encoding, and the whole way from the sampler to a mailbox."""
from __future__ import annotations

import asyncio
import os
import queue

import msgspec
import numpy as np
import torch
import zmq

from rill.asgi.engine_link.client import EngineClient
from rill.asgi.engine_link.mailbox import Mailbox
from rill.engine_proc.core import EngineCore
from rill.engine_proc.io_threads import InputThread, OutputThread
from rill.engine_proc.sample.sampler import Sampler
from rill.engine_proc.sched.block_manager import BlockManager
from rill.engine_proc.sched.scheduler import Scheduler
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths, make_socket
from rill.ipc.logprobs import TokenLogprobs, decode_logprobs, encode_logprobs

EOS_ID = 2


def random_logprobs(num_tokens: int, num_top: int, seed: int = 0) -> TokenLogprobs:
    rng = np.random.default_rng(seed)
    return TokenLogprobs(
        rng.integers(0, 50_000, (num_tokens, 1 + num_top)).astype(np.int32),
        -rng.random((num_tokens, 1 + num_top), dtype=np.float32) * 20,
        rng.integers(1, 50_000, num_tokens).astype(np.int32),
    )


def test_roundtrip_through_a_step_message_is_exact():
    first, second = random_logprobs(1, 20, seed=1), random_logprobs(3, 0, seed=2)
    msg = p.StepOutputs(
        [p.RequestDelta("a", 1, logprobs=encode_logprobs(first)), p.RequestDelta("b", 3, p.FinishReason.STOP),
         p.RequestDelta("c", 3, logprobs=encode_logprobs(second))],
        [7, 8, 9, 10, 11, 12, 13],
    )
    back = p.output_decoder.decode(p.output_encoder.encode(msg))
    assert back.deltas[1].logprobs is None
    for sent, delta in ((first, back.deltas[0]), (second, back.deltas[2])):
        got = decode_logprobs(delta.logprobs)
        assert got.num_tokens == sent.num_tokens and got.num_top == sent.num_top
        assert got.token_ids.dtype == np.int32 and got.logprobs.dtype == np.float32
        for name in ("token_ids", "logprobs", "ranks"):
            assert np.array_equal(getattr(got, name), getattr(sent, name)), name


def test_raw_bytes_are_compact_and_absent_when_not_asked():
    """Top-20 for one token: 21 ids + 21 floats + a rank, 4 bytes each, plus a few bytes of framing."""
    payload = msgspec.msgpack.encode(encode_logprobs(random_logprobs(1, 20)))
    assert len(payload) <= 43 * 4 + 16
    plain = msgspec.msgpack.decode(p.output_encoder.encode(p.RequestDelta("a", 1)))
    assert plain == ["a", 1, None, 0, 0, None, None, None, None, None]  # absent: one msgpack nil (array_like keeps defaults)


def test_mailbox_merges_logprobs_of_steps_not_yet_taken():
    mailbox = Mailbox(2)
    parts = [random_logprobs(1, 5, seed=s) for s in range(3)]
    for i, lp in enumerate(parts):
        mailbox.put(0, [i], None, 0, 0, lp)
    mailbox.put(1, [5], None, 0, 0)
    ids, merged = mailbox.take(0)
    assert ids == [0, 1, 2] and merged.num_tokens == 3
    assert np.array_equal(merged.logprobs, np.concatenate([lp.logprobs for lp in parts]))
    assert mailbox.take(0) == ([], None)
    assert mailbox.take(1) == ([5], None)


class FixedLogitsRunner:
    """The model's edge: every sampled seq gets the same row of logits; the real sampler picks."""

    lora = None  # the Runner protocol's (engine_proc/model/runner_api.py)

    def __init__(self, row: torch.Tensor) -> None:
        self.row = row
        self.vocab_size = row.shape[0]
        self.sampler = Sampler([EOS_ID], seed=0)

    def execute(self, batch):
        seqs = batch.sampled_seqs
        return self.sampler.sample(self.row.expand(len(seqs), -1), seqs)


def test_logprobs_travel_from_the_sampler_to_the_mailbox(tmp_path):
    """Submit -> input thread -> scheduler -> sampler -> output thread -> engine client -> mailbox."""
    row = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 2
    raw = torch.log_softmax(row, dim=0)
    scheduler = Scheduler(BlockManager(16, 4, enable_prefix_caching=False), max_num_seqs=4,
                          max_num_batched_tokens=64, max_model_len=64, eos_token_ids=[EOS_ID])
    paths = RunPaths("test", tmp_path)
    ctx = zmq.Context()
    inputs: queue.SimpleQueue = queue.SimpleQueue()
    input_thread, output_thread = InputThread(ctx, paths, inputs), OutputThread(ctx, paths)
    core = EngineCore(scheduler, FixedLogitsRunner(row), inputs, output_thread.publish)
    input_thread.start()
    output_thread.start()

    async def run() -> tuple[list, list]:
        client = EngineClient(paths, os.getpid())
        client.start()
        mailbox = Mailbox(2)
        try:
            for index, logprobs in enumerate((4, None)):
                params = p.SamplingParams(max_tokens=2, temperature=0.0, logprobs=logprobs, ignore_eos=True)
                await client.submit([f"r{index}"], [[5, 6, 7]], params, mailbox, index)
            while scheduler.num_waiting < 2:
                await asyncio.to_thread(core.drain_inputs, block=True)
            taken: list[list] = [[], []]
            for _ in range(2):  # two steps: the prefill's token, then one decode
                core.publish_deltas(core.step(scheduler.schedule()))
                assert await mailbox.wait(timeout_s=10)
                for index in range(2):
                    taken[index].append(mailbox.take(index))
            return taken
        finally:
            client.close()

    try:
        taken = asyncio.run(run())
    finally:
        stop = make_socket(ctx, zmq.PUSH, paths.engine_input, bind=False)
        stop.send(p.input_encoder.encode(p.Shutdown()))
        output_thread.publish(None)
        input_thread.join(5)
        output_thread.join(5)
        stop.close()
        input_thread.close()
        ctx.term()
    greedy = int(row.argmax())
    top = raw.topk(4)
    for ids, lp in taken[0]:
        assert ids == [greedy] and lp.num_tokens == 1
        assert lp.token_ids[0].tolist() == [greedy, *top.indices.tolist()]
        assert np.array_equal(lp.logprobs[0], np.array([raw[greedy], *top.values], dtype=np.float32))
        assert lp.ranks.tolist() == [1]
    assert taken[1] == [([greedy], None), ([greedy], None)]


def test_tied_top_logprobs_list_the_lowest_id_first_as_greedy_picks_it():
    """bfloat16 logits tie often: the top entries must order ties as argmax does (lowest id first),
    so that a greedy token is its own first top entry."""
    import torch

    from rill.engine_proc.sample.sampler import gather_logprobs

    logits = torch.full((1, 4096), -5.0)
    logits[0, [7, 3000, 1500]] = 2.0  # a three-way tie at the top
    raw = logits.log_softmax(dim=-1)
    greedy = raw.max(dim=-1).indices
    (lp,) = gather_logprobs(raw, greedy, [3])
    assert greedy.item() == 7
    assert lp.token_ids[0, 1:].tolist() == [7, 1500, 3000]


def test_the_top_k_is_the_stable_sorts_first_k():
    """top_stable sorts only the entries at or above the k-th: the same ids, in the same order, as a stable
    descending sort of the whole row, with bfloat16's ties, -inf entries, and a row all alike."""
    import torch

    from rill.engine_proc.sample.top_logprobs import top_stable

    torch.manual_seed(0)
    rows = torch.randn(6, 3000).to(torch.bfloat16).float()
    rows[1, ::3] = float("-inf")
    rows[2] = 0.0
    rows[3, :50] = rows[3].max()  # fifty tied at the top
    raw = rows.log_softmax(dim=-1)
    for k in (1, 5, 20, 64):
        values, ids = top_stable(raw, k)
        want_values, want_ids = raw.sort(dim=-1, descending=True, stable=True)
        assert torch.equal(ids, want_ids[:, :k]) and torch.equal(values, want_values[:, :k]), k
