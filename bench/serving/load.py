"""The load generator: sends each request at its arrival time, under a concurrency cap and a time bound.

Arrivals are Poisson or gamma as in vLLM; outputs come back in workload order.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence

import aiohttp
import numpy as np

from rill.bench.serving.client import RequestOutput, RequestState, send_request


def arrival_offsets_s(num_requests: int, request_rate: float, burstiness: float,
                      rng: np.random.Generator) -> list[float]:
    """Send times relative to the start, as vLLM draws them.

    Gaps are gamma(shape=burstiness, scale=1 / (rate * burstiness)): burstiness 1 is a Poisson
    process, lower is burstier, inf is evenly spaced. The cumulative times are rescaled to end
    at num_requests / rate, as vLLM does, so that seeds differ in order, not in total rate.
    """
    if burstiness <= 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    if request_rate <= 0:
        raise ValueError(f"request_rate must be > 0, got {request_rate}")
    if math.isinf(request_rate) or num_requests == 0:
        return [0.0] * num_requests
    if math.isinf(burstiness):
        gaps_s = np.full(num_requests, 1.0 / request_rate)
    else:
        gaps_s = rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=num_requests)
    offsets_s = np.cumsum(gaps_s)
    offsets_s *= (num_requests / request_rate) / offsets_s[-1]
    return offsets_s.tolist()


async def run_load(session: aiohttp.ClientSession, url: str, headers: dict[str, str], bodies: Sequence[bytes],
                   prompt_lens: Sequence[int], offsets_s: Sequence[float], *, max_concurrency: int | None = None,
                   max_duration_s: float | None = None, drain_timeout_s: float = 30.0,
                   on_done: Callable[[RequestOutput], None] | None = None,
                   require_done: bool = True) -> tuple[list[RequestOutput], float]:
    """Send every body at its offset; returns the outputs (in body order) and the duration in s.

    As in vLLM, a request waiting for a concurrency slot is not yet sent: its clock starts when
    it gets the slot. With max_duration_s, nothing is sent after the deadline; requests in flight
    then get drain_timeout_s to finish, after which they are cancelled and marked CANCELLED.
    """
    outputs = [RequestOutput(prompt_len) for prompt_len in prompt_lens]
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency else None
    start_s = time.perf_counter()
    deadline_s = start_s + max_duration_s if max_duration_s else math.inf

    async def one(i: int) -> None:
        out = outputs[i]
        try:
            if slots is not None:
                await slots.acquire()
            try:
                if time.perf_counter() >= deadline_s:
                    return  # stays NOT_SENT
                await send_request(session, url, bodies[i], headers, out, require_done=require_done)
            finally:
                if slots is not None:
                    slots.release()
        except asyncio.CancelledError:
            if out.start_s:
                out.state = RequestState.CANCELLED
            raise
        if on_done is not None:
            on_done(out)

    tasks = []
    for i, offset_s in enumerate(offsets_s):
        send_at_s = start_s + offset_s
        if send_at_s >= deadline_s:
            break
        delay_s = send_at_s - time.perf_counter()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        tasks.append(asyncio.create_task(one(i)))
    if tasks:
        timeout_s = None if math.isinf(deadline_s) else max(deadline_s + drain_timeout_s - time.perf_counter(), 0.0)
        _, pending = await asyncio.wait(tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return outputs, time.perf_counter() - start_s
