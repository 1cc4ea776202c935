"""The API worker's link to the engine: submit, abort, and route step outputs to mailboxes.

One per worker process. Submits go to the engine's PULL socket; each step's StepOutputs
arrives on this worker's own PULL socket (only this worker's requests are in it). Under
admission control (a queue bound set) the engine answers each Submit with an Admission on the
same socket, ahead of the request's deltas, and `submit()` waits for it.
A watchdog notices the engine's death and fails every waiting request at once.
"""
from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import zmq
import zmq.asyncio

from rill.asgi.engine_link.dp_router import EngineChooser, total_stats
from rill.asgi.engine_link.mailbox import Mailbox
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths, make_socket
from rill.ipc.logprobs import decode_logprobs

log = logging.getLogger("rill.api")
ENGINE_DEAD = "The inference engine stopped unexpectedly."


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")  # a zombie is dead to us, reaped or not
    except (FileNotFoundError, IndexError, ProcessLookupError):
        return False


class EngineClient:
    """With several engines (--data-parallel-size), each API request goes to one of them, chosen by
    `EngineChooser` (asgi/engine_link/dp_router.py); all of them answer on this worker's socket."""

    def __init__(self, paths: RunPaths, engine_pids: int | list[int], admission_control: bool = False,
                 block_size: int = 16):
        self.paths = paths
        self.engine_pids = [engine_pids] if isinstance(engine_pids, int) else list(engine_pids)
        self.engine_pid = self.engine_pids[0]
        self.admission_control = admission_control
        self._admissions: dict[str, asyncio.Future] = {}  # by a Submit's first req_id
        self.worker_id = str(os.getpid())
        self.alive = True
        self._routes: dict[str, tuple[Mailbox, int]] = {}
        self._engine_of: dict[str, int] = {}  # req_id -> engine rank, with several engines
        # Questions every engine answers (a StatsQuery, a CacheReset): each waiter with the answers so far, by rank
        self._stats_waiters: list[tuple[asyncio.Future, dict[int, p.EngineStats]]] = []
        self._reset_waiters: list[tuple[asyncio.Future, dict[int, p.CacheResetResult]]] = []
        # adapter name -> (its future, the engines' LoRAResults so far by rank, how many engines answer)
        self._lora_waiters: dict[str, tuple[asyncio.Future, dict[int, p.LoRAResult], int]] = {}
        self.chooser = EngineChooser(len(self.engine_pids), block_size)
        self._ctx = zmq.asyncio.Context()
        self._outs = [make_socket(self._ctx, zmq.PUSH, paths.engine_input_for(rank), bind=False)
                      for rank in range(len(self.engine_pids))]
        self._out = self._outs[0]
        self._in = make_socket(self._ctx, zmq.PULL, paths.worker_output(self.worker_id), bind=True)
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_outputs()), loop.create_task(self._watch_engine())]

    async def submit(self, req_ids: list[str], prompts: list[list[int]], params: p.SamplingParams,
                     mailbox: Mailbox, first_index: int = 0, n: int = 1) -> p.Admission | None:
        """Sends one API request's engine requests (choice i to mailbox index first_index + i);
        `n` choices per prompt: req_ids[i * n + j] is prompt i's choice j.

        Under admission control, returns the engine's Admission once it came (a refused request
        is forgotten here); else None at once: everything is admitted.
        """
        if not self.alive:
            raise EngineDead
        rank = self.chooser.choose(prompts[0], params.cache_salt)
        for i, req_id in enumerate(req_ids):
            self._routes[req_id] = (mailbox, first_index + i)
            if rank:
                self._engine_of[req_id] = rank
        answer = None
        if self.admission_control:
            answer = self._admissions[req_ids[0]] = asyncio.get_running_loop().create_future()
        try:
            await self._outs[rank].send(p.input_encoder.encode(p.Submit(req_ids, self.worker_id, params, prompts, n)))
            if answer is None:
                return None
            admission = await answer
        finally:
            self._admissions.pop(req_ids[0], None)
        if admission.verdict is not p.Verdict.ADMITTED:
            for req_id in req_ids:
                self._routes.pop(req_id, None)
                self._engine_of.pop(req_id, None)
        return admission

    async def abort(self, req_ids: list[str]) -> None:
        live = [r for r in req_ids if self._routes.pop(r, None) is not None]
        if not live or not self.alive:
            return
        by_engine: dict[int, list[str]] = {}
        for req_id in live:
            by_engine.setdefault(self._engine_of.pop(req_id, 0), []).append(req_id)
        for rank, ids in by_engine.items():
            await self._outs[rank].send(p.input_encoder.encode(p.Abort(ids)))

    async def cancel(self, req_ids: list[str]) -> None:
        """Ends requests another worker owns: their engine (unknown here: every engine is asked; the
        others know no such request) sends their worker a CANCELLED delta."""
        if self.alive:
            for out in self._outs:
                await out.send(p.input_encoder.encode(p.Abort(req_ids, notify=True)))

    async def stats(self, timeout_s: float = 5.0) -> p.EngineStats:
        """Every engine's figures summed."""
        return total_stats(await self.stats_per_engine(timeout_s))

    async def stats_per_engine(self, timeout_s: float = 5.0) -> list[p.EngineStats]:
        return await self._ask_every_engine(p.StatsQuery(self.worker_id), self._stats_waiters, timeout_s)

    async def reset_prefix_cache(self, timeout_s: float = 30.0) -> list[p.CacheResetResult]:
        """Every engine's prefix cache emptied, between two of its steps: each one's answer, by rank."""
        return await self._ask_every_engine(p.CacheReset(self.worker_id), self._reset_waiters, timeout_s)

    async def _ask_every_engine(self, question, waiters: list, timeout_s: float) -> list:
        if not self.alive:
            raise EngineDead
        fut = asyncio.get_running_loop().create_future()
        waiters.append((fut, {}))
        for out in self._outs:
            await out.send(p.input_encoder.encode(question))
        return await asyncio.wait_for(fut, timeout_s)

    async def update_lora(self, name: str, path: str = "", timeout_s: float = 120.0, *,
                          load_inplace: bool = False) -> p.LoRAResult:
        """Loads (a path) or unloads (none) a LoRA adapter in the engine, between two of its steps;
        `load_inplace` replaces one loaded under that name."""
        if not self.alive:
            raise EngineDead
        if name in self._lora_waiters:
            return p.LoRAResult(name, f"The lora adapter '{name}' is being loaded or unloaded already.", 400)
        results = await self._lora_everywhere(p.LoRAUpdate(self.worker_id, name, path, load_inplace), timeout_s)
        failed = [r for r in results if r.error]
        if failed and path and not load_inplace and len(failed) < len(results):
            # Loaded by some engines only (a file changed meanwhile, memory): taken back, so every engine serves the
            # same adapters and any may take a request for it.
            await self._lora_everywhere(p.LoRAUpdate(self.worker_id, name), timeout_s,
                                        ranks=[r.data_parallel_rank for r in results if not r.error])
        return failed[0] if failed else results[0]

    async def _lora_everywhere(self, update: p.LoRAUpdate, timeout_s: float, ranks: list[int] | None = None
                               ) -> list[p.LoRAResult]:
        """`update` sent to each engine of `ranks` (all of them by default): their answers, by rank."""
        ranks = list(range(len(self._outs))) if ranks is None else ranks
        fut = asyncio.get_running_loop().create_future()
        self._lora_waiters[update.name] = (fut, {}, len(ranks))
        try:
            for rank in ranks:
                await self._outs[rank].send(p.input_encoder.encode(update))
            answers = await asyncio.wait_for(fut, timeout_s)
            return [answers[rank] for rank in sorted(answers)]
        finally:
            self._lora_waiters.pop(update.name, None)

    async def _read_outputs(self) -> None:
        while True:
            frame = await self._in.recv(copy=False)
            msg = p.output_decoder.decode(frame.buffer)
            if isinstance(msg, p.Admission):
                answer = self._admissions.get(msg.req_id)
                if answer is not None and not answer.done():
                    answer.set_result(msg)
                continue
            if isinstance(msg, p.EngineStats):
                self._stats_waiters = self._answer(self._stats_waiters, msg)
                continue
            if isinstance(msg, p.CacheResetResult):
                self._reset_waiters = self._answer(self._reset_waiters, msg)
                continue
            if isinstance(msg, p.LoRAResult):
                if (waiter := self._lora_waiters.get(msg.name)) is not None:
                    fut, answers, expected = waiter
                    answers[msg.data_parallel_rank] = msg
                    if len(answers) == expected and not fut.done():
                        fut.set_result(answers)
                continue
            self.chooser.reported(msg.data_parallel_rank, msg.num_running, msg.num_waiting)
            ids = msg.ids
            start = 0
            for delta in msg.deltas:
                new_ids = ids[start : start + delta.num_new]
                start += delta.num_new
                route = self._routes.get(delta.req_id)
                if route is None:  # aborted here already
                    continue
                mailbox, index = route
                logprobs = None if delta.logprobs is None else decode_logprobs(delta.logprobs)
                mailbox.put(index, new_ids, delta.finish, delta.num_prompt_tokens, delta.num_cached_tokens,
                            logprobs, delta.timings)
                if delta.prompt_logprobs is not None:
                    mailbox.choices[index].prompt_logprobs = decode_logprobs(delta.prompt_logprobs)
                if delta.embedding is not None:
                    mailbox.choices[index].embedding = delta.embedding
                if delta.prediction_tokens is not None:
                    mailbox.choices[index].prediction_tokens = delta.prediction_tokens
                if delta.finish is not None:
                    del self._routes[delta.req_id]
                    self._engine_of.pop(delta.req_id, None)

    def _answer(self, waiters: list, answer) -> list:
        """A waiter is answered once every engine has answered it (by rank, in order); those still waiting."""
        waiting = []
        for fut, answers in waiters:
            answers.setdefault(answer.data_parallel_rank, answer)
            if fut.done():
                continue
            if len(answers) == len(self._outs):
                fut.set_result([answers[rank] for rank in sorted(answers)])
            else:
                waiting.append((fut, answers))
        return waiting

    async def _watch_engine(self, interval_s: float = 0.2) -> None:
        while all(process_alive(pid) for pid in self.engine_pids):
            await asyncio.sleep(interval_s)
        gone = [pid for pid in self.engine_pids if not process_alive(pid)]
        log.error("engine process %s is gone; failing %d requests", gone, len(self._routes))
        self.alive = False
        for mailbox, _ in list(self._routes.values()):
            mailbox.fail(ENGINE_DEAD)
        self._routes.clear()
        for fut in [*(f for f, _ in self._stats_waiters), *self._admissions.values()]:
            if not fut.done():
                fut.set_exception(EngineDead())

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for out in self._outs:
            out.close()
        self._in.close()
        self._ctx.term()
        Path(self.paths.worker_output(self.worker_id).removeprefix("ipc://")).unlink(missing_ok=True)


class EngineDead(Exception):
    pass
