"""What the Responses API and Conversations keep, and the interface of the stores that keep it.

One store serves every API worker of a server (and, with Redis, every server behind a load
balancer): `--state-store` picks it (asgi/stores/open.py). Bounds (a count and a TTL per kind)
are enforced by the store itself, so they hold across workers. A store that cannot be reached
or read raises StoreUnavailable, which the routes that need it answer with a 503; nothing else
depends on it. Records are JSON (msgspec); their content is never logged.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any

import msgspec


class StoredResponse(msgspec.Struct, kw_only=True):
    id: str
    response: dict[str, Any]  # the Response object as last written
    input_items: list[dict[str, Any]]  # this request's own input items, each with an id
    messages: list[dict[str, Any]]  # the chat messages of the whole chain (input + output), for chaining


class Conversation(msgspec.Struct, kw_only=True):
    id: str
    created_at: int
    metadata: dict[str, str]

    def resource(self) -> dict:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


@dataclass(frozen=True)
class Bounds:
    """At most `max_entries`, each kept `ttl_s` from its last write (responses) or its creation
    (conversations). Either at 0 disables the kind: nothing is kept."""

    max_entries: int
    ttl_s: float

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.ttl_s > 0


class StoreUnavailable(Exception):
    """The store cannot be reached or read (a corrupt file, a Redis that is down)."""


class StateStore(abc.ABC):
    def __init__(self, responses: Bounds, conversations: Bounds):
        self.responses = responses
        self.conversations = conversations

    # ---- responses ----
    @abc.abstractmethod
    async def put_response(self, record: StoredResponse) -> None:
        """Insert or replace; the TTL counts from now. Evicts the oldest past the count bound."""

    @abc.abstractmethod
    async def get_response(self, response_id: str) -> StoredResponse | None: ...

    @abc.abstractmethod
    async def delete_response(self, response_id: str) -> bool: ...

    # ---- conversations ----
    @abc.abstractmethod
    async def put_conversation(self, conv: Conversation, items: list[dict[str, Any]] | None = None) -> None:
        """Create (with `items`) or update a conversation's metadata; its TTL counts from creation."""

    @abc.abstractmethod
    async def get_conversation(self, conversation_id: str) -> Conversation | None: ...

    @abc.abstractmethod
    async def delete_conversation(self, conversation_id: str) -> bool:
        """The conversation and all its items."""

    @abc.abstractmethod
    async def add_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Appends; False if the conversation is gone."""

    @abc.abstractmethod
    async def list_items(self, conversation_id: str) -> list[dict[str, Any]] | None:
        """Every item in order; None if the conversation is gone."""

    @abc.abstractmethod
    async def delete_item(self, conversation_id: str, item_id: str) -> bool: ...

    async def close(self) -> None:
        return None


def encode(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


response_decoder = msgspec.json.Decoder(StoredResponse)
conversation_decoder = msgspec.json.Decoder(Conversation)
item_decoder = msgspec.json.Decoder(dict[str, Any])
