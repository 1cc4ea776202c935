"""ResponseStore: bounded by entry count (the oldest evicted first) and by age, with a fake clock."""
from __future__ import annotations

from asgi.stores.responses import ResponseStore, StoredResponse


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(name: str) -> StoredResponse:
    return StoredResponse({"id": name}, [], [])


def test_count_bound_evicts_the_oldest():
    store = ResponseStore(max_entries=2, ttl_s=60, clock=FakeClock())
    for name in ("a", "b", "c"):
        store.put(name, entry(name))
    assert store.get("a") is None
    assert store.get("b").response == {"id": "b"} and store.get("c") is not None
    assert len(store) == 2


def test_put_again_refreshes_age_and_order():
    clock = FakeClock()
    store = ResponseStore(max_entries=2, ttl_s=60, clock=clock)
    store.put("a", entry("a"))
    store.put("b", entry("b"))
    clock.now += 30
    store.put("a", store.get("a"))  # a response that finished later is stored again
    store.put("c", entry("c"))
    assert store.get("b") is None and store.get("a") is not None
    clock.now += 45  # a is 45 s old, c 45 s: both kept; 75 s after b's put
    assert store.get("a") is not None


def test_ttl_expires_entries():
    clock = FakeClock()
    store = ResponseStore(max_entries=10, ttl_s=60, clock=clock)
    store.put("a", entry("a"))
    clock.now += 30
    store.put("b", entry("b"))
    clock.now += 31
    assert store.get("a") is None and store.get("b") is not None
    clock.now += 30
    assert store.get("b") is None and len(store) == 0


def test_delete():
    store = ResponseStore(max_entries=10, ttl_s=60, clock=FakeClock())
    store.put("a", entry("a"))
    assert store.delete("a") and not store.delete("a") and store.get("a") is None


def test_zero_disables():
    for store in (ResponseStore(0, 60, FakeClock()), ResponseStore(10, 0, FakeClock())):
        store.put("a", entry("a"))
        assert not store.enabled and store.get("a") is None and len(store) == 0
