"""A real `rill serve` for end-to-end tests (bench/servers.py starts and stops it)."""
from __future__ import annotations

from pathlib import Path

import httpx

from bench.servers import ServerProcess


def shm_segments(run_id: int) -> list[str]:
    return sorted(p.name for p in Path("/dev/shm").glob(f"rill_{run_id}_*"))


def stats(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/stats", timeout=10).json()
