"""A real `rill serve` for end-to-end tests (bench/serving/servers.py starts and stops it)."""
from __future__ import annotations

from pathlib import Path

import httpx

from rill.bench.serving.servers import ServerProcess, rill_server
from rill.ipc.channels import run_dirs_of


def leftovers(run_id: int) -> list[str]:
    """What a run of `rill serve` (run id: the launcher's pid) left in /dev/shm or /tmp."""
    return sorted(str(p) for p in [*Path("/dev/shm").glob(f"rill_{run_id}_*"), *run_dirs_of(run_id)])


def stats(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/stats", timeout=10).json()


def sdk_client(server: ServerProcess):
    """The OpenAI SDK against `server`, validating every response strictly, no retries."""
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", _strict_response_validation=True,
                  max_retries=0, timeout=120)


def child_pids(parent: int) -> list[int]:
    """The pids whose parent is `parent` (zombies included), from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                pids.append(int(entry.name))
    return pids


def session_pids(session_id: int) -> list[int]:
    """The live processes of a server started in a session of its own (`rill_server` does: the launcher's pid is
    the session's id): its launcher, engines and workers, and whatever of them outlived the launcher."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session_id and fields[0] not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


TINY_MODEL = "tiny"  # the served model id of `tiny_server`
TINY_MAX_LOGPROBS = 40  # `tiny_server`'s --max-logprobs


def launch_server(tmp_path_factory, *flags: str, env: dict[str, str] | None = None,
                  compiled: bool = False) -> ServerProcess:
    """A `rill serve` with `flags`, started but not yet ready; eager unless `compiled`: compiling decode
    steps costs each start about 30 s on two cores even from the disk cache, and one compiled server
    (`server`) covers it."""
    log_path = tmp_path_factory.mktemp("rill") / "serve.log"
    eager = () if compiled or "--enforce-eager" in flags else ("--enforce-eager",)
    return rill_server(*flags, *eager, log_path=log_path, env=env)


def start_server(tmp_path_factory, *flags: str, env: dict[str, str] | None = None,
                 compiled: bool = False) -> ServerProcess:
    """A ready `rill serve` with `flags` (see launch_server)."""
    return launch_server(tmp_path_factory, *flags, env=env, compiled=compiled).wait_ready()


def start_servers(tmp_path_factory, *flag_lists: tuple[str, ...]) -> list[ServerProcess]:
    """Several ready servers, launched together: their starts (about 5 s each, mostly one process
    importing) overlap on two cores. If one fails to start, all are stopped."""
    servers = [launch_server(tmp_path_factory, *flags) for flags in flag_lists]
    try:
        return [srv.wait_ready() for srv in servers]
    except BaseException:
        for srv in servers:
            srv.stop()
        raise


def stop_server(server: ServerProcess) -> None:
    code = server.stop()
    assert code == 0, f"rill serve exited with {code}:\n{server.log()}"
    assert "did not stop" not in server.log(), "the engine had to be killed"
    assert leftovers(server.proc.pid) == [], "shared memory or socket files left behind"
