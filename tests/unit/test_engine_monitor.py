"""The drain's wait after the engine is idle (rill/engine_monitor.py): FLUSH_S after the last delta, which an
idle answer before the drain, with no request ended since, dates."""
from __future__ import annotations

from rill.engine_monitor import idle_alike
from rill.ipc import protocol as p


def stats(running: int = 0, waiting: int = 0, finished: int = 5, aborted: int = 1, rejected: int = 0,
          timed_out: int = 0) -> p.EngineStats:
    return p.EngineStats(num_running=running, num_waiting=waiting, num_free_blocks=10, num_total_blocks=10,
                         num_aborted=aborted, num_finished=finished, num_rejected=rejected, num_timed_out=timed_out)


def test_an_idle_engine_with_nothing_ended_since_needs_no_new_flush():
    assert idle_alike(stats(), stats())


def test_anything_running_before_or_ended_since_needs_the_flush():
    assert not idle_alike(None, stats())
    assert not idle_alike(stats(running=1), stats())
    assert not idle_alike(stats(waiting=1), stats())
    assert not idle_alike(stats(), stats(running=1))
    for ended in ({"finished": 6}, {"aborted": 2}, {"rejected": 1}, {"timed_out": 1}):
        assert not idle_alike(stats(), stats(**ended)), ended
