"""`rill serve`: resolve the model, start the engine, wait for READY, run Granian, clean up.

Signals: SIGTERM, SIGINT and SIGHUP drain in-flight requests, then stop (a second one stops at
once); the engine, the ranks and the API workers ignore SIGHUP (the launcher decides). An API
worker that dies is replaced, and the engine ends the requests it had (docs/systemd.md).
Exit status: 0 after a normal stop, 1 when the engine died or failed to start, or a worker
kept dying (so a supervisor restarts us), 2 for a bad command line.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import threading
import time
from pathlib import Path

import msgspec
import zmq

from asgi.http.auth import API_KEY_ENV, KeyFileError, collect_api_keys, digest
from asgi.serving.chat_flags import chat_settings
from asgi.serving.engine_monitor import EngineMonitor
from asgi.serving.lora_flags import lora_modules
from asgi.serving.parallel_flags import engine_configs
from asgi.serving.sdnotify import Notifier, ServiceReporter
from asgi.state import SETTINGS_ENV, WorkerSettings
from asgi.stores.open import StoreURLError, check_url, describe
from engine_proc.main import EngineConfig, run_engine
from ipc import protocol as p
from ipc.channels import RunPaths, make_socket, remove_stale_run_dirs
from ipc.logs import configure_logging

log = logging.getLogger("rill")
ABORT_WAIT_S = 5.0  # after the drain timed out: for the engine to end what is left
ENGINE_DEATH_GRACE_S = 1.0  # after an engine died: for the workers to fail their streams first
BUNDLED_MODEL_ID = "smollm2-135m-instruct"


def resolve_model(args) -> tuple[Path, str]:
    if args.model is None:
        from engine_proc.model.bundled import ensure_bundled_model

        return ensure_bundled_model(args.cache_dir), args.served_model_name or BUNDLED_MODEL_ID
    model_dir = Path(args.model).expanduser()
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"rill: --model {args.model}: not a local Hugging Face model directory "
                         "(no config.json); Rill never downloads models")
    return model_dir.resolve(), args.served_model_name or model_dir.name


def start_engine(config: EngineConfig, timeout_s: float = 600.0):
    """Start the engine process and wait for its READY message; returns (process, limits)."""
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=run_engine, args=(config, child_conn), name="rill-engine", daemon=False)
    # Started with SIGHUP ignored, which exec keeps: the engine sets that itself, but the first
    # start also launches multiprocessing's resource tracker, which a terminal hangup killed.
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        proc.start()
    finally:
        signal.signal(signal.SIGHUP, hup)
    child_conn.close()
    deadline = time.monotonic() + timeout_s
    while not parent_conn.poll(0.2):
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the engine process exited before it was ready")
    message = msgspec.json.decode(parent_conn.recv_bytes())
    if isinstance(message, str):
        proc.join(10)
        raise RuntimeError(f"the engine failed to start: {message}")
    return proc, msgspec.convert(message, p.EngineLimits)


def stop_engine(proc, paths: RunPaths, timeout_s: float = 10.0, rank: int = 0) -> None:
    if proc.is_alive():
        ctx = zmq.Context()
        sock = make_socket(ctx, zmq.PUSH, paths.engine_input_for(rank), bind=False)
        sock.send(p.input_encoder.encode(p.Shutdown()))
        proc.join(timeout_s)
        sock.close()
        ctx.term()
    if proc.is_alive():
        log.warning("engine did not stop in %.0f s; killing it", timeout_s)
        proc.kill()
        proc.join()


def make_draining_granian():
    """Granian, but SIGTERM/SIGINT/SIGHUP first drain in-flight requests, then stop the workers,
    and a worker that died is replaced after its engine requests were ended.

    Granian's own worker shutdown stops the worker's event loop while it waits for open
    connections, so a stream in progress could never finish there; we finish them first.
    """
    from granian import Granian

    class DrainingGranian(Granian):
        def __init__(self, paths: RunPaths, timeout_s: float, monitor: EngineMonitor, reporter: ServiceReporter,
                     *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.paths = paths
            self.monitor = monitor
            self.reporter = reporter
            self.drain_timeout_s = timeout_s
            self.drain_thread: threading.Thread | None = None

        def signal_handler_interrupt(self, *args, **kwargs):
            if self.drain_thread is not None:  # a second signal: stop now
                log.warning("second stop signal: stopping without waiting")
                return super().signal_handler_interrupt()
            self.drain_thread = threading.Thread(target=self._drain_then_stop, name="drain", daemon=True)
            self.drain_thread.start()

        def signal_handler_reload(self, *args, **kwargs):
            """SIGHUP (a terminal hangup, `kill -HUP`): a drain and a stop, as SIGTERM. Granian's
            reload respawned the workers with no drain: streams were cut without an error event or
            [DONE], and their engine requests ran on for nobody. Nothing here is reloadable
            without a restart (the flags, the model), so a stop is what the signal can mean."""
            if os.getpid() != self.pid:  # a worker, forked with this handler: not its call to make
                return
            log.info("SIGHUP: stopping as on SIGTERM")
            self.signal_handler_interrupt()

        def _respawn_workers(self, workers, *args, **kwargs):
            """A worker that died (Granian's respawn_failed_workers) leaves engine requests whose
            deltas go nowhere: the engine ends them (each engine request names its worker, whose
            id is its pid)."""
            old = [self.wrks[idx].inner for idx in workers]
            for proc in old:
                if not proc.is_alive():
                    log.error("API worker %d died (exit code %s); ending its requests, starting another",
                              proc.pid, proc.exitcode)
                    self.monitor.abort_all(worker_id=str(proc.pid))
            alive = [proc for proc in old if proc.is_alive()]
            super()._respawn_workers(workers, *args, **kwargs)
            for proc in alive:  # replaced alive: Granian stopped it, and its streams with it
                self.monitor.abort_all(worker_id=str(proc.pid))

        def _drain_then_stop(self) -> None:
            self.paths.draining_flag.touch()
            self.reporter.stopping()
            log.info("draining: waiting up to %.0f s for in-flight requests", self.drain_timeout_s)
            if not self.monitor.wait_idle(self.drain_timeout_s) and self.monitor.engine_alive():
                # The engine ends each with an ABORT delta; its worker sends an error event and [DONE].
                stats = self.monitor.latest
                log.warning("%d requests still running after %.0f s; ending them with an error",
                            stats.num_running + stats.num_waiting if stats else -1, self.drain_timeout_s)
                self.monitor.abort_all()
                self.monitor.wait_idle(ABORT_WAIT_S)
            super().signal_handler_interrupt()

    return DrainingGranian


class EngineWatch(threading.Thread):
    """Turns an unexpected engine exit into a stop of the whole server, with a failure status."""

    def __init__(self, proc):
        super().__init__(name="engine-watch", daemon=True)
        self.proc = proc
        self.stopping = False
        self.engine_died = False

    def run(self) -> None:
        # Wait on the sentinel, never join: stop_engine joins, and two threads reaping one child
        # race (the loser's waitpid gets ECHILD, reads "still alive", and stop_engine warned
        # "did not stop" and sent SIGKILL to a reaped pid).
        multiprocessing.connection.wait([self.proc.sentinel])
        if not self.stopping:
            self.engine_died = True
            log.error("the engine process died (exit code %s); shutting down", self.proc.exitcode)
            # The workers notice the death themselves (EngineClient polls every 0.2 s) and end every
            # stream with an error event: give them that long before Granian stops them.
            time.sleep(ENGINE_DEATH_GRACE_S)
            os.kill(os.getpid(), signal.SIGTERM)  # Granian's handler stops the workers


def serve(args) -> int:
    log_config = configure_logging(args.log_level, args.log_format, args.log_requests)
    try:
        edge = edge_settings(args)  # before the engine starts: a bad key file fails fast
        check_url(args.state_store)
    except (KeyFileError, StoreURLError) as exc:
        log.error("%s", exc)
        return 2
    notifier = Notifier.from_env()  # takes $NOTIFY_SOCKET out of the environment: children stay quiet
    notifier.send("STATUS=loading the model")
    remove_stale_run_dirs()
    model_dir, model_id = resolve_model(args)
    paths = RunPaths.create(str(os.getpid()))
    config = EngineConfig(
        model_dir=str(model_dir), model_id=model_id, run_id=paths.run_id, run_dir=str(paths.run_dir),
        dtype=args.dtype, device=args.device, attention_backend=args.attention_backend,
        load_format=args.load_format, quantization=args.quantization, speculative_config=args.speculative_config,
        max_loras=args.max_loras if args.enable_lora else 0, max_lora_rank=args.max_lora_rank,
        lora_modules=lora_modules(args),
        block_size=args.block_size, kv_cache_memory_bytes=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        num_threads=args.num_threads, log_level=args.log_level.upper(),
        log_format=args.log_format,
        enable_prefix_caching=args.enable_prefix_caching, model_impl=args.model_impl,
        batch_invariant=args.batch_invariant, enforce_eager=args.enforce_eager, max_queued_requests=args.max_queued_requests,
        max_queued_tokens=args.max_queued_tokens, request_timeout_s=args.request_timeout,
        enable_embeddings=args.enable_embeddings,
        kv_events_endpoint=args.kv_events_endpoint, kv_events_topic=args.kv_events_topic,
        tensor_parallel_size=args.tensor_parallel_size, nnodes=args.nnodes, master_addr=args.master_addr,
        master_port=args.master_port,
    )
    procs = []
    watches: list[EngineWatch] = []
    monitor = reporter = None
    http_failed = False
    try:
        log.info("state store: %s", describe(args.state_store))
        every_limits = []
        for rank, rank_config in enumerate(engine_configs(config, args.data_parallel_size)):
            log.info("starting engine %d of %d for %s (%s)", rank + 1, args.data_parallel_size, model_id, model_dir)
            proc, rank_limits = start_engine(rank_config)
            procs.append(proc)
            every_limits.append(rank_limits)
            log.info("engine %d ready (pid %d): max_model_len %d, %d KV blocks", rank, proc.pid,
                     rank_limits.max_model_len, rank_limits.num_kv_blocks)
        limits = every_limits[0]
        os.environ[SETTINGS_ENV] = WorkerSettings(
            served_model_name=model_id, run_id=paths.run_id, run_dir=str(paths.run_dir), engine_pid=procs[0].pid,
            engine_pids=[proc.pid for proc in procs],
            limits=limits, sse_keepalive_s=args.sse_keepalive,
 max_body_bytes=args.max_request_body,
            chat_template=args.chat_template, created=int(time.time()), **edge, **chat_settings(args),
            metrics_prefix=args.metrics_prefix, allow_runtime_lora_updating=args.allow_runtime_lora_updating,
            state_store_url=args.state_store,
            responses_store_max_entries=max(args.responses_store_max_entries, 0),
            responses_store_ttl_s=max(args.responses_store_ttl, 0.0),
            conversations_store_max_entries=max(args.conversations_store_max_entries, 0),
            conversations_store_ttl_s=max(args.conversations_store_ttl, 0.0),
        ).to_env()
        # GET /metrics: every worker counts into its own files here and any worker sums them all
        # (prometheus_client's multiprocess mode); a fresh folder per run, removed with the run dir.
        metrics_dir = paths.run_dir / "metrics"
        metrics_dir.mkdir(mode=0o700, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        watches = [EngineWatch(proc) for proc in procs]
        for watch in watches:
            watch.start()
        # systemd (asgi/serving/sdnotify.py) and the drain both watch the engine loop through the monitor.
        monitor = EngineMonitor(paths, lambda: all(proc.is_alive() for proc in procs),
                                poll_s=min(0.5, notifier.watchdog_s / 8 or 0.5), num_engines=len(procs))
        monitor.start()
        reporter = ServiceReporter(notifier, monitor, model_id, args.host, args.port)
        reporter.start()
        http_failed = run_granian(args, paths, monitor, reporter, log_config)
    except RuntimeError as exc:
        log.error("%s", exc)
        return 1
    finally:
        for watch in watches:
            watch.stopping = True
        for thread in (reporter, monitor):
            if thread is not None:
                thread.stop()
        for rank, proc in enumerate(procs):
            stop_engine(proc, paths, rank=rank)
        if monitor is not None:
            monitor.join(2)
        notifier.close()
        paths.remove_run_dir()
    return 1 if http_failed or any(watch.engine_died for watch in watches) else 0


def edge_settings(args) -> dict:
    """The WorkerSettings of API keys (digests only), CORS and the access log."""
    keys = collect_api_keys(args.api_key, args.api_key_file, os.environ)
    if keys:
        log.info("API keys: %d configured; /v1/* needs one%s", len(keys),
                 ", and /metrics and /stats" if args.protect_metrics else "")
    elif args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no API key (--api-key, $%s): anyone who reaches %s:%d can use this server",
                    API_KEY_ENV, args.host, args.port)
    return dict(api_key_digests=[digest(k) for k in keys], protect_metrics=args.protect_metrics,
                allowed_origins=args.allowed_origins, allowed_methods=args.allowed_methods,
                allowed_headers=args.allowed_headers, access_log=args.access_log, log_requests=args.log_requests)


def http1_settings(timeout_keep_alive_s: float):
    """Granian's HTTP/1 header read timeout is also how long an idle keep-alive connection lives."""
    from granian.http import HTTP1Settings

    if timeout_keep_alive_s <= 0:
        return HTTP1Settings(keep_alive=False)
    return HTTP1Settings(header_read_timeout=max(1, round(timeout_keep_alive_s * 1000)))


def run_granian(args, paths: RunPaths, monitor: EngineMonitor, reporter: ServiceReporter,
                log_config: dict | None = None) -> bool:
    """Serve until stopped; True when Granian reports a failure (a worker crashed)."""
    from granian.constants import Interfaces, Loops

    server = make_draining_granian()(
        paths,
        args.shutdown_timeout,
        monitor,
        reporter,
        "asgi.app:app",
        address=args.host,
        port=args.port,
        interface=Interfaces.ASGI,
        workers=args.workers,
        loop=Loops.uvloop,
        log_level=args.log_level,
        log_dictconfig=log_config,  # the run's format in Granian's own lines and in every worker
        http1_settings=http1_settings(args.timeout_keep_alive),
        workers_kill_timeout=5,  # requests were drained before the workers are told to stop
        # A worker that dies (killed, out of memory) is replaced rather than stopping the server; one
        # that dies again within 5.5 s of its start stops it, with exit status 1 (a crash loop).
        respawn_failed_workers=True,
        backlog=2048,
    )
    try:
        server.serve()
    except SystemExit as exc:  # Granian exits non-zero when a worker crashed
        if exc.code:
            log.error("the HTTP server stopped with status %s", exc.code)
            return True
    return False
