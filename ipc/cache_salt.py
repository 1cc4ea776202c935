"""The prefix-cache salt as it crosses from the API workers to the engine, and the chain root it makes.

A request's salt (SamplingParams.cache_salt: 16 bytes of a SHA-256, or empty for none; asgi/requests/cache_salt.py
derives it from the API key and the request's `cache_salt`) enters the root hash its chain of blocks starts from,
so the same tokens under two salts hash apart from the first block on. The engine's prefix cache
(engine_proc/sched/prefix_cache.py) and the data-parallel router's affinity (asgi/engine_link/dp_router.py) both
start from this root, so a tenant's affinity still finds the engine holding its own blocks.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable

SALT_LEN = 16  # bytes: 128 bits, so two tenants' salts meet only by a SHA-256 collision


def salted_root(parent_hash: int, salt: bytes, hash_fn: Callable[[Hashable], int] = hash) -> int:
    """The root hash of a salted chain, from the unsalted one (the base model's or a LoRA adapter load's).

    Ints only: Python's int and tuple-of-int hashes are the same in every process (str and bytes hashes
    are not), so the API worker and the engine compute the same root, and KV events publish stable hashes.
    An (int, int) key is never a block's key, which is (int, tuple of ids)."""
    return hash_fn((parent_hash, int.from_bytes(salt, "big")))
