"""Prefix-cache isolation: the salt a request's blocks are cached under, from its API key and its `cache_salt`.

vLLM's `cache_salt` (CVE-2025-46570's fix) is a field the caller writes, so one tenant can copy another's salt
and learn, from `cached_tokens` or the time to first token, whether the other's prompt is cached. Under
`--prefix-cache-isolation key` the salt is derived from the authenticated key as well (its SHA-256 digest,
which the workers hold; asgi/http/auth.py): a request's `cache_salt` only ever splits its own key's cache
further, never joins another's. See docs/prefix-caching.md.
"""
from __future__ import annotations

import hashlib
from typing import Annotated

from msgspec import Meta

from rill.ipc.cache_salt import SALT_LEN

ISOLATIONS = ("none", "key")
# vLLM's field: a non-empty string. Bounded here (vLLM does not bound it): it is hashed, never stored.
MAX_CACHE_SALT_LEN = 256
CacheSalt = Annotated[str, Meta(min_length=1, max_length=MAX_CACHE_SALT_LEN)]


def default_isolation(isolation: str | None, has_api_keys: bool) -> str:
    """--prefix-cache-isolation as given, else `key` when API keys are configured and `none` without."""
    return isolation or ("key" if has_api_keys else "none")


def engine_salt(key_digest: str, cache_salt: str | None) -> bytes:
    """SamplingParams.cache_salt: 16 bytes of SHA-256 over the key's digest ("" under isolation `none`, or for a
    request without a key) and the request's `cache_salt`; b"" when there is neither (the shared cache).

    The digest is hex, so the NUL after it ends it unambiguously: no (key, salt) pair can be written as
    another's, whatever the salt holds."""
    if not key_digest and cache_salt is None:
        return b""
    text = f"rill-cache-salt\0{key_digest}\0{cache_salt or ''}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:SALT_LEN]


def images_salt(salt: bytes, digest: bytes) -> bytes:
    """A request's salt with its images' digest (ipc/images.py) in it: the same text beside other images is
    never a prefix-cache hit, and the same images under another key's salt neither."""
    return hashlib.sha256(b"rill-images\0" + salt + b"\0" + digest).digest()[:SALT_LEN]
