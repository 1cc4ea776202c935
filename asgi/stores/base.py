"""What the Responses API and Conversations keep, its bounds, and the interface of the stores that keep it.

One store serves every API worker of a server (and, with Redis, every server behind a load
balancer): `--state-store` picks it (asgi/stores/open.py). The public methods here are the same
for every back end: they check ids by shape, keep only the fields the API defines for each item
(asgi/stores/items.py) and check the bounds in bytes that need no stored state; the back ends
apply the rest (count, TTL, total bytes, a conversation's room) in the same transaction as the
write, so they hold across workers. A store that cannot be reached or read raises
StoreUnavailable, which the routes that need it answer with a 503; nothing else depends on it.
Records are JSON (msgspec); their content is never logged.
"""
from __future__ import annotations

import abc
import logging
import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from rill.asgi.stores.items import CONVERSATION_ID, ITEM_ID, RESPONSE_ID, Refused, stored_items

log = logging.getLogger("rill.store")

# One item (a message, a call's output): beyond any model's context, so never a real turn.
MAX_ITEM_BYTES = 1 << 20
# A conversation is read whole into every prompt that uses it: 1,000 items or 16 MiB (both past
# any context a served model has) are room for every real conversation, and a bound on each read.
MAX_CONVERSATION_ITEMS = 1000
MAX_PAGE = 100  # `limit` of a list, as OpenAI's spec


class StoredResponse(msgspec.Struct, kw_only=True):
    id: str
    response: dict[str, Any]  # the Response object as last written
    # This request's own input items, each with an id: written with the record, read back only a
    # page at a time (page_response_items); get_response leaves it empty.
    input_items: list[dict[str, Any]]
    messages: list[dict[str, Any]]  # the chat messages of the whole chain (input + output), for chaining
    # A streamed background response's events (append_response_events): None when none are kept; else how many the
    # store holds, written with the final Response, and whether they run to its terminal event (`events_whole`).
    events: int | None = None
    events_whole: bool = False


class Conversation(msgspec.Struct, kw_only=True):
    id: str
    created_at: int
    metadata: dict[str, str]

    def resource(self) -> dict:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at, "metadata": self.metadata}


@dataclass(frozen=True)
class Bounds:
    """At most `max_entries` and `max_bytes` in all, the oldest evicted first, each kept `ttl_s`
    from its last write (responses) or its creation (conversations); one entry (a response with
    its input items, a conversation with its items) at most `max_entry_bytes`. `max_entries` or
    `ttl_s` at 0 disables the kind: nothing is kept."""

    max_entries: int
    ttl_s: float
    max_bytes: int = 256 << 20  # the count bound governs real use (1,000 entries of a few KiB)
    max_entry_bytes: int = 16 << 20

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.ttl_s > 0


class StoreUnavailable(Exception):
    """The store cannot be reached or read (a corrupt file, a Redis that is down)."""


class AfterNotFound(LookupError):
    """A page's `after` names no item of its owner (raised by the back ends)."""


class Page(msgspec.Struct):
    items: list[dict[str, Any]]
    has_more: bool


Order = Literal["asc", "desc"]
AddResult = Literal["added", "gone", "too_many_items", "too_many_bytes"]
_RESPONSE_ID, _CONVERSATION_ID, _ITEM_ID = re.compile(RESPONSE_ID), re.compile(CONVERSATION_ID), re.compile(ITEM_ID)


def is_response_id(value: str) -> bool:
    return _RESPONSE_ID.fullmatch(value) is not None


def is_conversation_id(value: str) -> bool:
    return _CONVERSATION_ID.fullmatch(value) is not None


def is_item_id(value: str) -> bool:
    return _ITEM_ID.fullmatch(value) is not None


def _minted(check, value: str) -> None:
    """Ids written are the server's own: another shape is a bug, never a key."""
    if not check(value):
        raise ValueError(f"not an id of the server's shape: {value[:80]!r}")


class StateStore(abc.ABC):
    def __init__(self, responses: Bounds, conversations: Bounds):
        self.responses = responses
        self.conversations = conversations

    # ---- responses ----
    async def put_response(self, record: StoredResponse) -> None:
        """Insert or replace; the TTL counts from now. Past its bytes, a response in progress (the
        first write, before any work) is a 400; a finished one (its output made it grow) is
        evicted at once, as the count bound would: the client has its answer already."""
        _minted(is_response_id, record.id)
        items = _encoded(stored_items(record.input_items, "input"), "input")
        body = encode(StoredResponse(id=record.id, response=record.response, input_items=[], messages=record.messages,
                                     events=record.events, events_whole=record.events_whole))
        num_bytes = len(body) + sum(len(raw) for _, raw in items)
        if num_bytes > self.responses.max_entry_bytes:
            if record.response.get("status") != "in_progress":
                await self._delete_response(record.id)
                log.warning("response %s is %d bytes, over the store's %d: evicted", record.id, num_bytes,
                            self.responses.max_entry_bytes)
                return
            raise Refused(f"This response would take {num_bytes} bytes in the state store, over its bound of "
                          f"{self.responses.max_entry_bytes} (input, instructions and the previous_response_id "
                          "chain together); send `store: false` or a shorter input.", "input")
        await self._put_response(record.id, body, items, num_bytes)

    async def get_response(self, response_id: str) -> StoredResponse | None:
        raw = await self._get_response(response_id) if is_response_id(response_id) else None
        return response_decoder.decode(raw) if raw is not None else None

    async def delete_response(self, response_id: str) -> bool:
        return is_response_id(response_id) and await self._delete_response(response_id)

    async def page_response_items(self, response_id: str, limit: int, order: Order, after: str | None) -> Page | None:
        """A page of a response's input items; None if the response is gone."""
        if not is_response_id(response_id):
            return None
        return await self._paged(self._page_response_items, response_id, limit, order, after)

    async def append_response_events(self, response_id: str, first: int, events: list[bytes]) -> bool:
        """Appends a streamed background response's events (whole SSE frames) numbered from `first`, the number it
        holds already. They count in its bytes and expire with it. False: the response is gone, or they would take
        it past its bytes (and no later ones are kept either: a reader gets the stored Response's end instead)."""
        _minted(is_response_id, response_id)
        return bool(events) and await self._append_events(response_id, first, events, sum(map(len, events)))

    async def response_events(self, response_id: str, after: int, limit: int) -> list[bytes] | None:
        """Up to `limit` events after sequence number `after`, in order; None if the response is gone."""
        if not is_response_id(response_id):
            return None
        return await self._read_events(response_id, max(after, -1), limit)

    # ---- conversations ----
    async def put_conversation(self, conv: Conversation, items: list[dict[str, Any]] | None = None) -> None:
        """Create (with `items`) or update a conversation's metadata; its TTL counts from creation."""
        _minted(is_conversation_id, conv.id)
        encoded = _encoded(stored_items(items or [], "items"), "items")
        body = encode(conv)
        self._check_room(len(encoded), len(body) + sum(len(raw) for _, raw in encoded))
        await self._put_conversation(conv.id, body, encoded)

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        raw = await self._get_conversation(conversation_id) if is_conversation_id(conversation_id) else None
        return conversation_decoder.decode(raw) if raw is not None else None

    async def delete_conversation(self, conversation_id: str) -> bool:
        """The conversation and all its items."""
        return is_conversation_id(conversation_id) and await self._delete_conversation(conversation_id)

    async def add_items(self, conversation_id: str, items: list[dict[str, Any]]) -> bool:
        """Appends; False if the conversation is gone, a 400 (Refused) if it has no room for them."""
        if not is_conversation_id(conversation_id):
            return False
        encoded = _encoded(stored_items(items, "items"), "items")
        self._check_room(len(encoded), sum(len(raw) for _, raw in encoded))
        result = await self._add_items(conversation_id, encoded) if encoded else \
            ("added" if await self._get_conversation(conversation_id) is not None else "gone")
        if result in ("too_many_items", "too_many_bytes"):  # with what it holds already
            raise self._full(result)
        return result == "added"

    def _check_room(self, num_items: int, num_bytes: int) -> None:
        """A 400 when a conversation would pass its bounds: refused, never trimmed (a prompt
        built from a conversation that lost its start would answer something else)."""
        if num_items > MAX_CONVERSATION_ITEMS:
            raise self._full("too_many_items")
        if num_bytes > self.conversations.max_entry_bytes:
            raise self._full("too_many_bytes")

    def _full(self, result: AddResult) -> Refused:
        bound = f"{MAX_CONVERSATION_ITEMS} items" if result == "too_many_items" else \
            f"{self.conversations.max_entry_bytes} bytes of items"
        return Refused(f"A conversation holds at most {bound}; these would take it past that.", "items",
                       code="conversation_full")

    async def all_items(self, conversation_id: str) -> tuple[list[dict[str, Any]], int] | None:
        """Every item in order and their bytes (a prompt reads the whole conversation); None if
        the conversation is gone."""
        raw = await self._all_items(conversation_id) if is_conversation_id(conversation_id) else None
        if raw is None:
            return None
        return [item_decoder.decode(body) for body in raw], sum(len(body) for body in raw)

    async def page_items(self, conversation_id: str, limit: int, order: Order, after: str | None) -> Page | None:
        """A page of a conversation's items, read as a page from the database; None if the
        conversation is gone; a 400 naming `after` if it names none of its items."""
        if not is_conversation_id(conversation_id):
            return None
        return await self._paged(self._page_items, conversation_id, limit, order, after)

    async def get_item(self, conversation_id: str, item_id: str) -> dict[str, Any] | None:
        if not (is_conversation_id(conversation_id) and is_item_id(item_id)):
            return None
        raw = await self._get_item(conversation_id, item_id)
        return item_decoder.decode(raw) if raw is not None else None

    async def delete_item(self, conversation_id: str, item_id: str) -> bool:
        return is_conversation_id(conversation_id) and is_item_id(item_id) and \
            await self._delete_item(conversation_id, item_id)

    async def _paged(self, read, owner_id: str, limit: int, order: Order, after: str | None) -> Page | None:
        if not 1 <= limit <= MAX_PAGE or order not in ("asc", "desc"):
            raise ValueError("a page's limit and order are checked by the route")
        try:
            if after is not None and not is_item_id(after):
                raise AfterNotFound
            got = await read(owner_id, limit, order, after)
        except AfterNotFound:
            raise Refused(f"`after` names no item of `{owner_id}`.", "after") from None
        if got is None:
            return None
        raw, has_more = got
        return Page([item_decoder.decode(body) for body in raw], has_more)

    async def close(self) -> None:
        return None

    # ---- the back end: ids and items checked, items encoded as (id, JSON) ----
    @abc.abstractmethod
    async def _put_response(self, response_id: str, body: bytes, items: list[tuple[str, bytes]],
                            num_bytes: int) -> None: ...

    @abc.abstractmethod
    async def _get_response(self, response_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _delete_response(self, response_id: str) -> bool: ...

    @abc.abstractmethod
    async def _page_response_items(self, response_id: str, limit: int, order: Order,
                                   after: str | None) -> tuple[list[bytes], bool] | None:
        """`limit` items after `after` in `order` and whether more follow; AfterNotFound."""

    @abc.abstractmethod
    async def _append_events(self, response_id: str, first: int, events: list[bytes], num_bytes: int) -> bool:
        """Appends if the response is alive, holds `first` events and has room for `num_bytes` more."""

    @abc.abstractmethod
    async def _read_events(self, response_id: str, after: int, limit: int) -> list[bytes] | None: ...

    @abc.abstractmethod
    async def _put_conversation(self, conversation_id: str, body: bytes, items: list[tuple[str, bytes]]) -> None: ...

    @abc.abstractmethod
    async def _get_conversation(self, conversation_id: str) -> bytes | None: ...

    @abc.abstractmethod
    async def _delete_conversation(self, conversation_id: str) -> bool: ...

    @abc.abstractmethod
    async def _add_items(self, conversation_id: str, items: list[tuple[str, bytes]]) -> AddResult:
        """Appends if the conversation has room (MAX_CONVERSATION_ITEMS, max_entry_bytes)."""

    @abc.abstractmethod
    async def _all_items(self, conversation_id: str) -> list[bytes] | None: ...

    @abc.abstractmethod
    async def _page_items(self, conversation_id: str, limit: int, order: Order,
                          after: str | None) -> tuple[list[bytes], bool] | None: ...

    @abc.abstractmethod
    async def _get_item(self, conversation_id: str, item_id: str) -> bytes | None:
        """The first item with that id."""

    @abc.abstractmethod
    async def _delete_item(self, conversation_id: str, item_id: str) -> bool:
        """The first item with that id."""


def _encoded(items: list[dict[str, Any]], param: str) -> list[tuple[str, bytes]]:
    encoded = [(item["id"], encode(item)) for item in items]
    for i, (_, raw) in enumerate(encoded):
        if len(raw) > MAX_ITEM_BYTES:
            raise Refused(f"An item may take at most {MAX_ITEM_BYTES} bytes in the state store; this one takes "
                          f"{len(raw)}.", f"{param}[{i}]")
    return encoded


def encode(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


response_decoder = msgspec.json.Decoder(StoredResponse)
conversation_decoder = msgspec.json.Decoder(Conversation)
item_decoder = msgspec.json.Decoder(dict[str, Any])
