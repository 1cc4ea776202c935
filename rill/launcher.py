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

from rill.asgi.http.auth import API_KEY_ENV, KeyFileError, collect_api_keys, digest
from rill.asgi.prompt.vision import model_type_of, whole_image_tokens
from rill.asgi.state import SETTINGS_ENV, WorkerSettings
from rill.asgi.stores.open import StoreURLError, check_url, describe
from rill.chat_flags import log_tool_parser
from rill.config_args import config_from_args
from rill.engine_monitor import EngineMonitor
from rill.engine_proc.main import run_engine
from rill.http_server import run_granian
from rill.hub_models import cached_snapshot, looks_like_repo_id
from rill.ipc import protocol as p
from rill.ipc.channels import RunPaths, make_socket, remove_stale_run_dirs
from rill.ipc.config import EngineConfig
from rill.ipc.images import PIXEL_BUDGET_TYPES
from rill.ipc.logs import configure_logging
from rill.listening import Listener, free_uds, reserve_port, systemd_socket
from rill.ollama_models import ollama_blob, ollama_name
from rill.parallel_flags import engine_configs
from rill.sdnotify import Notifier, ServiceReporter

log = logging.getLogger("rill")
# The engine's environment, unless the operator set these. THP_MEM_ALLOC_ENABLE: torch's CPU allocator
# asks for transparent huge pages (madvise) for its large tensors. A prompt step's big activations are
# fresh allocations every time (glibc maps anything past 32 MB anew), and their 4 KB page faults cost:
# allocating and filling a 2,048-token step's 37 MB MLP output took 12.4 ms, 3.7 with it (2-core Xeon).
ENGINE_ENV_DEFAULTS = {"THP_MEM_ALLOC_ENABLE": "1"}
ENGINE_DEATH_GRACE_S = 1.0  # after an engine died: for the workers to fail their streams first
BUNDLED_MODEL_ID = "smollm2-135m-instruct"


def resolve_model(args) -> tuple[Path, str]:
    """The model directory `rill serve` runs and its served id: the bundled model, a GGUF file (or a model Ollama
    pulled: rill/ollama_models.py) converted once, a local directory, or a hub id found in the Hugging Face cache
    (rill/hub_models.py). A model it cannot find or read stops the start (exit 1), saying why."""
    if args.model is None:
        from rill.engine_proc.model.bundled import ensure_bundled_model

        return ensure_bundled_model(args.cache_dir), served_name(args) or BUNDLED_MODEL_ID
    try:
        if (ollama := ollama_name(args.model)) is not None:
            return _converted(ollama_blob(ollama), args), served_name(args) or ollama
        model_dir = Path(args.model).expanduser()
        if model_dir.suffix == ".gguf" and model_dir.is_file():
            return _converted(model_dir, args), served_name(args) or model_dir.name
        if not model_dir.exists() and looks_like_repo_id(args.model):  # vLLM's `vllm serve ORG/NAME`
            snapshot = cached_snapshot(args.model, args.revision, args.download_dir)
            return snapshot, served_name(args) or args.model  # vLLM's default name: the id as given
    except (ValueError, OSError) as exc:
        raise SystemExit(f"rill: --model {args.model}: {exc}") from None
    if not (model_dir / "config.json").is_file():
        raise SystemExit(f"rill: --model {args.model}: not a local Hugging Face model directory "
                         "(no config.json) or GGUF file; Rill never downloads models")
    return model_dir.resolve(), served_name(args) or model_dir.name


def _converted(gguf_path: Path, args) -> Path:
    """A GGUF file's converted directory, converted once into the cache (engine_proc/model/gguf_dir.py)."""
    from rill.engine_proc.model.bundled import default_cache_dir
    from rill.engine_proc.model.gguf_dir import ensure_gguf_model

    return ensure_gguf_model(gguf_path, Path(args.cache_dir) if args.cache_dir else default_cache_dir())


def served_name(args) -> str | None:
    """--served-model-name's first name: the model's id (the rest are aliases: config_args.py)."""
    return args.served_model_name[0] if args.served_model_name else None


def set_engine_env_defaults() -> None:
    """ENGINE_ENV_DEFAULTS into this process's environment, which the engine processes inherit."""
    for name, value in ENGINE_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)


def launch_engine(config: EngineConfig, paths: RunPaths, rank: int = 0):
    """Start the engine process (`rank`: among --data-parallel-size); returns (process, the end of the pipe its
    READY message comes on), for wait_engine."""
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=run_engine, args=(config, paths, child_conn, rank), name="rill-engine", daemon=False)
    # Started with SIGHUP ignored, which exec keeps: the engine sets that itself, but the first
    # start also launches multiprocessing's resource tracker, which a terminal hangup killed.
    hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        proc.start()
    finally:
        signal.signal(signal.SIGHUP, hup)
    child_conn.close()
    return proc, parent_conn


def wait_engine(proc, parent_conn, timeout_s: float = 600.0) -> p.EngineLimits:
    """The engine's READY message (its limits); a RuntimeError if it failed or exited first."""
    deadline = time.monotonic() + timeout_s
    while not parent_conn.poll(0.2):
        if not proc.is_alive() or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the engine process exited before it was ready")
    message = msgspec.json.decode(parent_conn.recv_bytes())
    if isinstance(message, str):
        proc.join(10)
        raise RuntimeError(f"the engine failed to start: {message}")
    return msgspec.convert(message, p.EngineLimits)


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
        key_digests = api_key_digests(args)  # before the engine starts: a bad key file fails fast
        check_url(args.state_store)
    except (KeyFileError, StoreURLError) as exc:
        log.error("%s", exc)
        return 2
    notifier = Notifier.from_env()  # takes $NOTIFY_SOCKET out of the environment: children stay quiet
    listener = Listener.of(args.host, args.port, args.uds, systemd_socket(), tls=bool(args.ssl_certfile))
    own_socket = None
    if listener.fd < 0 and listener.uds and (why := free_uds(listener.uds)):
        log.error("--uds %s: %s", listener.uds, why)
        return 2
    if listener.fd < 0 and not listener.uds:
        try:
            own_socket = reserve_port(args.host, args.port)
        except OSError as exc:
            log.error("--host %s --port %d: %s (another server listens there?)", args.host, args.port,
                      exc.strerror or exc)
            return 2
    notifier.send("STATUS=loading the model")
    set_engine_env_defaults()
    remove_stale_run_dirs()
    model_dir, model_id = resolve_model(args)
    if args.mm_processor_kwargs and model_type_of(model_dir) not in PIXEL_BUDGET_TYPES:
        log.error("--mm-processor-kwargs: %s is not a Qwen2-VL or Qwen2.5-VL model, whose pixel budget is all it sets",
                  model_id)
        return 2
    if (image_tokens := whole_image_tokens(model_dir)) > args.max_num_batched_tokens:
        log.error("--max-num-batched-tokens %d: an image of %s is %d tokens that attend both ways, which one step must "
                  "hold", args.max_num_batched_tokens, model_id, image_tokens)
        return 2
    paths = RunPaths.create(str(os.getpid()))
    config = config_from_args(args, model_dir, model_id)
    log_cache_isolation(config, bool(key_digests))
    log_tool_parser(args, model_dir)
    num_engines = config.engine.parallel.data_parallel_size
    procs = []
    watches: list[EngineWatch] = []
    monitor = reporter = None
    http_failed = False
    every_limits: list[p.EngineLimits] = []  # of the engines ready, in rank order
    try:
        log.info("state store: %s", describe(config.http.state_store_url))
        # Every engine starts at once (--data-parallel-size): each loads its model while the others do.
        ready_pipes = []
        for rank, rank_config in enumerate(engine_configs(config.engine)):
            log.info("starting engine %d of %d for %s (%s)", rank + 1, num_engines, model_id, model_dir)
            proc, ready_pipe = launch_engine(rank_config, paths, rank)
            procs.append(proc)
            ready_pipes.append(ready_pipe)
        for rank, (proc, ready_pipe) in enumerate(zip(procs, ready_pipes)):
            rank_limits = wait_engine(proc, ready_pipe)
            every_limits.append(rank_limits)
            log.info("engine %d ready (pid %d): max_model_len %d, %d KV blocks", rank, proc.pid,
                     rank_limits.max_model_len, rank_limits.num_kv_blocks)
        limits = every_limits[0]
        os.environ[SETTINGS_ENV] = WorkerSettings(
            http=config.http, run_id=paths.run_id, run_dir=str(paths.run_dir), engine_pids=[proc.pid for proc in procs],
            limits=limits, created=int(time.time()), api_key_digests=key_digests,
        ).to_env()
        # GET /metrics: every worker counts into its own files here and any worker sums them all
        # (prometheus_client's multiprocess mode); a fresh folder per run, removed with the run dir.
        metrics_dir = paths.run_dir / "metrics"
        metrics_dir.mkdir(mode=0o700, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        watches = [EngineWatch(proc) for proc in procs]
        for watch in watches:
            watch.start()
        # systemd (rill/sdnotify.py) and the drain both watch the engine loop through the monitor.
        monitor = EngineMonitor(paths, lambda: all(proc.is_alive() for proc in procs),
                                poll_s=min(0.5, notifier.watchdog_s / 8 or 0.5), num_engines=len(procs))
        monitor.start()
        reporter = ServiceReporter(notifier, monitor, model_id, listener)
        reporter.start()
        log.info("serving on %s", listener.url())
        http_failed = run_granian(config, paths, monitor, reporter, listener, log_config, own_socket)
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
            if rank < len(every_limits):
                stop_engine(proc, paths, rank=rank)
            else:  # still starting, or failed to: it reads no input yet
                proc.kill()
                proc.join()
        if monitor is not None:
            monitor.join(2)
        notifier.close()
        paths.remove_run_dir()
    return 1 if http_failed or any(watch.engine_died for watch in watches) else 0


def log_cache_isolation(config, has_keys: bool) -> None:
    """Which prefix-cache isolation runs (docs/prefix-caching.md), and a warning where `key` can do nothing."""
    if not config.engine.scheduler.enable_prefix_caching:
        return
    isolation = config.http.prefix_cache_isolation
    if isolation == "key" and not has_keys:
        log.warning("--prefix-cache-isolation key without API keys: every request shares one prefix cache")
    else:
        log.info("prefix cache isolation: %s%s", isolation,
                 " (each API key's prompts are cached apart)" if isolation == "key" else "")


def api_key_digests(args) -> list[str]:
    """The digests of --api-key, --api-key-file and $RILL_API_KEY: what the workers check against."""
    keys = collect_api_keys(args.api_key, args.api_key_file, os.environ)
    if keys:
        log.info("API keys: %d configured; every path needs one but /health, /ready%s", len(keys),
                 "" if args.protect_metrics else " and /metrics, /stats, /version, /loads")
    elif args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("no API key (--api-key, $%s): anyone who reaches %s:%d can use this server",
                    API_KEY_ENV, args.host, args.port)
    return [digest(k) for k in keys]
