"""A real `rill serve` for end-to-end tests (bench/servers.py starts and stops it)."""
from __future__ import annotations

from pathlib import Path

import httpx

from bench.servers import ServerProcess


def leftovers(run_id: int) -> list[str]:
    """What a run of `rill serve` (run id: the launcher's pid) left in /dev/shm or /tmp."""
    return sorted(str(p) for p in [*Path("/dev/shm").glob(f"rill_{run_id}_*"), *Path("/tmp").glob(f"rill-{run_id}")])


def stats(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/stats", timeout=10).json()
