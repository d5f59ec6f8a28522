"""The conversation's items: what one connection remembers of them, within bounds,
and the ``conversation.item.added`` / ``.done`` events that announce them.

OpenAI keeps the whole conversation; VoiceChat hears audio only, so the items are
kept just for ``conversation.item.retrieve`` and for ``previous_item_id``: the
newest ``MAX_ITEMS`` within ``MAX_ITEMS_BYTES``, every client item within
``MAX_ITEM_BYTES``.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

from realtime.openai import events as ev

MAX_ITEMS: Final = 256
"""Items remembered for ``conversation.item.retrieve``."""
MAX_ITEM_BYTES: Final = 256 * 1024
"""Largest item a client may create (:func:`item_bytes`). Twice the text of a
32k-token realtime context, and VoiceChat hears none of it (only audio): a bigger
item is a mistake or an attack, refused rather than stored."""
MAX_ITEMS_BYTES: Final = 4 * 1024 * 1024
"""What all remembered items may weigh together (:func:`item_bytes`); past it the
oldest are forgotten, as OpenAI truncates the oldest items out of a conversation.
Without it 256 items of a 4 MiB message each were gigabytes of Python objects."""
VALUE_BYTES: Final = 64
"""What each JSON value of an item is charged on top of its text: CPython spends
64 to 72 bytes on an empty object or array that is 3 bytes of JSON."""


def item_bytes(item: ev.Item) -> int:
    """What an item weighs in memory, near enough: its UTF-8 JSON plus
    ``VALUE_BYTES`` per value."""
    return ev.utf8_size(ev.serialize(item)) + VALUE_BYTES * ev.shape(item).values


def client_item(item: ev.Item, fresh_id: str) -> ev.Item:
    """A client's ``conversation.item.create`` item with the fields every stored
    item has (``fresh_id`` when it brought no id of its own)."""
    stored = dict(item)
    stored.setdefault("id", fresh_id)
    stored.setdefault("object", "realtime.item")
    stored.setdefault("status", "completed")
    if stored["type"] == "message":
        stored.setdefault("content", [])
    return stored


class ItemStore:
    """The conversation's items for ``conversation.item.retrieve``: the newest
    ``MAX_ITEMS`` within ``MAX_ITEMS_BYTES``, the oldest forgotten first. The item
    just stored is always kept (the dialect refuses client items over
    ``MAX_ITEM_BYTES``, the model's own are small)."""

    def __init__(self) -> None:
        self._items: OrderedDict[str, tuple[ev.Item, int]] = OrderedDict()
        self.bytes = 0
        """What the stored items weigh together (:func:`item_bytes`)."""

    def put(self, item: ev.Item, size: int | None = None) -> None:
        """Store ``item`` as the newest (replacing one of the same id); ``size``: its
        :func:`item_bytes`, when already known."""
        item_id: str = item["id"]
        old = self._items.pop(item_id, None)
        if old is not None:
            self.bytes -= old[1]
            if old[0] is item:
                size = old[1]
        if size is None:
            size = item_bytes(item)
        self._items[item_id] = (item, size)
        self.bytes += size
        while len(self._items) > 1 and (
            len(self._items) > MAX_ITEMS or self.bytes > MAX_ITEMS_BYTES
        ):
            _, (_, dropped) = self._items.popitem(last=False)
            self.bytes -= dropped

    def get(self, item_id: str) -> ev.Item | None:
        found = self._items.get(item_id)
        return found[0] if found is not None else None

    def pop(self, item_id: str) -> None:
        found = self._items.pop(item_id, None)
        if found is not None:
            self.bytes -= found[1]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)


class ItemLog:
    """The items as the client learns of them: each ``added`` names the one added
    before it (``previous_item_id``), and every item announced is stored."""

    def __init__(self) -> None:
        self.store = ItemStore()
        self.last: str | None = None
        """The id of the item added last, for the next ``previous_item_id``."""

    def added(self, item: ev.Item, *, size: int | None = None) -> ev.Event:
        """``conversation.item.added`` for ``item``, now the newest; ``size``: its
        :func:`item_bytes`, when already known."""
        event = ev.event("conversation.item.added", item=copy.deepcopy(item))
        if self.last is not None:
            event["previous_item_id"] = self.last
        self.last = item["id"]
        self.store.put(item, size)
        return event

    def done(self, item: ev.Item) -> ev.Event:
        """``conversation.item.done`` for ``item`` in its final form."""
        event = ev.event("conversation.item.done", item=copy.deepcopy(item))
        self.store.put(item)
        return event
