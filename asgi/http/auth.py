"""API keys: where they come from (flags, RILL_API_KEY, key files) and the Bearer check on every path.

The workers never hold a key: the launcher hands them SHA-256 digests, and a presented key is
hashed and compared with `hmac.compare_digest` against every configured digest, with no early
exit, so neither the timing nor the logs tell which key matched or how much of one did.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from rill.asgi.errors import APIError

API_KEY_ENV = "RILL_API_KEY"
# Default deny: with keys, every path needs one but these (normalised paths, asgi.http.paths), so
# an unknown path is a 401 too and a new route is guarded without anyone having to remember it.
# A load balancer's or orchestrator's probes, sent without a key:
OPEN_PATHS = frozenset({"/health", "/ready", "/ping"})  # /ping: SageMaker's
# What scrapers and gateways poll (figures, load, version): open unless --protect-metrics.
# /server_info and /model_info are not among them: they show the model's absolute path.
METRICS_PATHS = frozenset({"/metrics", "/stats", "/version", "/loads", "/v1/loads"})
_CHALLENGE = [(b"www-authenticate", b"Bearer")]


class KeyFileError(ValueError):
    pass


def read_key_file(path: str) -> list[str]:
    """One key per line; blank lines and lines starting with # are skipped."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise KeyFileError(f"--api-key-file {path}: {exc.strerror or exc}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:  # an empty file must not silently leave the server open
        raise KeyFileError(f"--api-key-file {path}: no keys in it")
    return keys


def collect_api_keys(flag_keys: list[str] | None, key_files: list[str] | None, environ) -> list[str]:
    """Every configured key: --api-key (repeatable), $RILL_API_KEY, and each --api-key-file."""
    keys = [k.strip() for k in flag_keys or ()]
    if env_key := environ.get(API_KEY_ENV, "").strip():
        keys.append(env_key)
    for path in key_files or ():
        keys.extend(read_key_file(path))
    if any(not k for k in keys):
        raise KeyFileError("--api-key: an empty key")
    return list(dict.fromkeys(keys))


def has_api_keys(args, environ=os.environ) -> bool:
    """Whether `rill serve` runs with keys (what --prefix-cache-isolation's default follows); read, not checked."""
    return bool(args.api_key or args.api_key_file or environ.get(API_KEY_ENV, "").strip())


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def unauthorized(message: str) -> APIError:
    return APIError(401, message, code="invalid_api_key", headers=_CHALLENGE)


class ApiKeyGuard:
    """Checks `Authorization: Bearer <key>` on the paths it guards; no digests: everything open."""

    def __init__(self, key_digests: list[str] = (), protect_metrics: bool = False):
        self.digests = [d.encode() for d in key_digests]
        self.protect_metrics = protect_metrics

    def guards(self, path: str | None) -> bool:
        """Whether `path` (normalised; None for one that cannot be) needs a key."""
        if not self.digests or path in OPEN_PATHS:
            return False
        return self.protect_metrics or path not in METRICS_PATHS

    def check(self, path: str | None, headers) -> str:
        """Raises the 401 when `path` is guarded and the request has no valid key; else the digest of the key
        it presented (what --prefix-cache-isolation key salts its cache with), "" on a path that needs none."""
        if not self.guards(path):
            return ""
        token = bearer_token(headers)
        if token is None:
            raise unauthorized("Missing API key: send it as `Authorization: Bearer <key>` (or `x-api-key: <key>`, "
                               "as Anthropic's clients do).")
        presented = digest(token).encode()
        matched = b""
        for known in self.digests:  # every digest, always: no early exit
            matched = known if hmac.compare_digest(presented, known) else matched
        if not matched:
            raise unauthorized("Incorrect API key provided.")
        return matched.decode()


def bearer_token(headers) -> str | None:
    """The key of `Authorization: Bearer <key>`, else of `x-api-key: <key>` (Anthropic's header)."""
    api_key = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.decode("utf-8", "replace").strip().partition(" ")
            token = token.strip()
            return token if scheme.lower() == "bearer" and token else None
        if name == b"x-api-key":
            api_key = value.decode("utf-8", "replace").strip() or None
    return api_key
