"""A runtime LoRA load or unload with several engines (--data-parallel-size): the API worker's EngineClient sends it
to every engine over its real ZeroMQ sockets and answers once all have; an adapter that only some engines loaded is
unloaded from those. The engines here are two stand-ins that answer each LoRAUpdate as told (the edge of the unit)."""
from __future__ import annotations

import asyncio
import os

import zmq
import zmq.asyncio

from rill.asgi.engine_link.client import EngineClient
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths, make_socket


async def fake_engines(ctx, paths: RunPaths, worker_id: str, refuse_on: set[int], seen: list[tuple[int, str, str]]):
    """Two engines: each records what it was sent and answers; those of `refuse_on` refuse a load with a 400."""
    ins = [make_socket(ctx, zmq.PULL, paths.engine_input_for(rank), bind=True) for rank in range(2)]
    out = make_socket(ctx, zmq.PUSH, paths.worker_output(worker_id), bind=False)

    async def serve(rank: int) -> None:
        while True:
            update = p.input_decoder.decode(await ins[rank].recv())
            seen.append((rank, update.name, update.path))
            refused = update.path and rank in refuse_on
            await out.send(p.output_encoder.encode(p.LoRAResult(update.name, "no room" if refused else "",
                                                                400 if refused else 200, rank)))

    tasks = [asyncio.create_task(serve(rank)) for rank in range(2)]
    return tasks, [*ins, out]


def run(refuse_on: set[int], tmp_path) -> tuple[p.LoRAResult, list[tuple[int, str, str]]]:
    async def main():
        paths = RunPaths("test", tmp_path)
        client = EngineClient(paths, [os.getpid(), os.getpid()])  # "alive" engines: this process
        client.start()
        seen: list[tuple[int, str, str]] = []
        tasks, sockets = await fake_engines(client._ctx, paths, client.worker_id, refuse_on, seen)
        try:
            result = await client.update_lora("tuned", "/adapters/tuned", timeout_s=10)
            await asyncio.sleep(0.2)  # a take-back's answers arrive
            return result, sorted(seen)
        finally:
            for task in tasks:
                task.cancel()
            for sock in sockets:
                sock.close()
            client.close()

    return asyncio.run(main())


def test_a_load_goes_to_every_engine(tmp_path):
    result, seen = run(set(), tmp_path)
    assert not result.error and seen == [(0, "tuned", "/adapters/tuned"), (1, "tuned", "/adapters/tuned")]


def test_a_load_one_engine_refused_is_taken_back_from_the_other(tmp_path):
    result, seen = run({1}, tmp_path)
    assert (result.status, result.error) == (400, "no room")
    assert seen == [(0, "tuned", ""), (0, "tuned", "/adapters/tuned"), (1, "tuned", "/adapters/tuned")]


def test_a_load_every_engine_refused_is_their_refusal_alone(tmp_path):
    result, seen = run({0, 1}, tmp_path)
    assert (result.status, result.error) == (400, "no room")
    assert seen == [(0, "tuned", "/adapters/tuned"), (1, "tuned", "/adapters/tuned")]  # nothing to take back
