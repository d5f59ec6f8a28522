"""GA client events as typed messages: one frozen value per event the dialect
serves, built from the client's JSON with every check that needs nothing but the
message itself.

:func:`parse_message` is the one door: JSON within bounds
(:func:`~realtime.openai.events.parse_client_event`), a known ``type``, the fields
that type needs. Whatever fails comes back as an
:class:`~realtime.openai.events.Invalid`, spelled as an ``error`` event by
:func:`~realtime.openai.events.refused`. Checks that need the session's state
(an active response, the backlog) are the dialect's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from realtime import endpoints
from realtime.models.base import Samples
from realtime.openai import events as ev
from realtime.wire_audio import PCM24, AudioFormatError, WireFormat


@attrs.frozen(slots=True)
class _Message:
    event_id: str | None = attrs.field(default=None, kw_only=True)
    """The client's own ``event_id``, echoed in an error about this message."""


@attrs.frozen(slots=True)
class SessionUpdate(_Message):
    session: dict[str, Any]
    """The update to merge: a GA session object (``type`` ``realtime`` or absent)."""


@attrs.frozen(slots=True, eq=False)
class AudioAppend(_Message):
    samples: Samples
    """The client's audio as float32, at the rate of the session's input format
    (each message is read in the format of the moment it arrives)."""


@attrs.frozen(slots=True)
class AudioCommit(_Message):
    pass


@attrs.frozen(slots=True)
class AudioClear(_Message):
    pass


@attrs.frozen(slots=True)
class OutputAudioClear(_Message):
    pass


@attrs.frozen(slots=True)
class ItemCreate(_Message):
    item: dict[str, Any]
    """An item object with a string ``type`` and, if any, a non-empty string ``id``."""


@attrs.frozen(slots=True)
class ItemRetrieve(_Message):
    item_id: str
    """The id asked for, as text (``"None"`` when none was given)."""
    asked: str
    """The ``item_id`` as the client sent it, for the error that names it."""


@attrs.frozen(slots=True)
class ItemTruncate(_Message):
    item_id: str
    content_index: int
    audio_end_ms: int


@attrs.frozen(slots=True)
class ItemDelete(_Message):
    item_id: str


@attrs.frozen(slots=True)
class ResponseCreate(_Message):
    metadata: Any
    """``response.metadata``, echoed in the response (``None`` when absent)."""


@attrs.frozen(slots=True)
class ResponseCancel(_Message):
    response_id: str | None
    """The response to cancel; ``None``: whichever is active."""


ClientMessage = (
    SessionUpdate
    | AudioAppend
    | AudioCommit
    | AudioClear
    | OutputAudioClear
    | ItemCreate
    | ItemRetrieve
    | ItemTruncate
    | ItemDelete
    | ResponseCreate
    | ResponseCancel
)
Parsed = ClientMessage | ev.Invalid
_Raw = dict[str, Any]

NATIVE_PROTOCOL_HINT: Final = endpoints.NATIVE_PROTOCOL_HINT
"""Added to a refusal of what only a native client sends: it reached the wrong
endpoint, and the refusal alone would not say which one is right."""
NATIVE_SESSION_FIELDS: Final = frozenset({"system_prompt", "seed", "max_streaming_seconds"})
"""The native protocol's session fields that a GA session has not (``model`` both
have). Refused, not ignored like other unknown fields: a native client whose
settings were silently dropped would go on and stream 16 kHz audio here."""
NATIVE_TYPES: Final = frozenset({"session.cancel", "session.ping"})
"""The native protocol's client messages that the GA dialect has not."""


def _session_update(raw: _Raw, cid: str | None) -> Parsed:
    update = raw.get("session")
    if not isinstance(update, dict):
        return ev.Invalid(
            "invalid_value", "session.update needs a 'session' object", "session", cid
        )
    if update.get("type", "realtime") != "realtime":
        return ev.Invalid(
            "invalid_value",
            "this server serves realtime sessions only (type: 'realtime')",
            "session.type",
            cid,
        )
    native = sorted(str(key) for key in update if key in NATIVE_SESSION_FIELDS)
    if native:
        return ev.Invalid(
            "unknown_parameter",
            f"{', '.join(f'session.{key}' for key in native)} belong"
            f"{'s' if len(native) == 1 else ''} to the native VoiceChat protocol, not to a "
            "GA session (the system prompt is 'instructions' here); this update was not "
            f"applied; {NATIVE_PROTOCOL_HINT}",
            f"session.{native[0]}",
            cid,
        )
    return SessionUpdate(update, event_id=cid)


def _append(raw: _Raw, cid: str | None, fmt: WireFormat) -> Parsed:
    if "sample_rate" in raw:  # a native append: taken as the session's format, it would be noise
        return ev.Invalid(
            "unknown_parameter",
            f"sample_rate belongs to the native VoiceChat protocol; here audio is "
            f"{fmt.type} at {fmt.rate} Hz (session.audio.input.format) and this append was "
            f"not accepted; {NATIVE_PROTOCOL_HINT}",
            "sample_rate",
            cid,
        )
    try:
        samples = fmt.decode(raw.get("audio"))
    except AudioFormatError as exc:
        return ev.Invalid(
            "invalid_value", f"{exc} (session.audio.input.format is {fmt.type})", "audio", cid
        )
    return AudioAppend(samples, event_id=cid)


def _item_create(raw: _Raw, cid: str | None) -> Parsed:
    item = raw.get("item")
    if not isinstance(item, dict) or not isinstance(item.get("type"), str):
        return ev.Invalid(
            "invalid_value", "conversation.item.create needs an 'item' object", "item", cid
        )
    if "id" in item and (not isinstance(item["id"], str) or not item["id"]):
        return ev.Invalid("invalid_value", "an item's id is a non-empty string", "item.id", cid)
    return ItemCreate(item, event_id=cid)


def _item_retrieve(raw: _Raw, cid: str | None) -> Parsed:
    item_id = raw.get("item_id")
    return ItemRetrieve(str(item_id), repr(item_id), event_id=cid)


def _item_truncate(raw: _Raw, cid: str | None) -> Parsed:
    end = raw.get("audio_end_ms")
    index = raw.get("content_index")
    return ItemTruncate(
        str(raw.get("item_id", "")),
        index if isinstance(index, int) else 0,
        end if isinstance(end, int) and end >= 0 else 0,
        event_id=cid,
    )


def _response_create(raw: _Raw, cid: str | None) -> Parsed:
    options = raw.get("response")
    return ResponseCreate(
        options.get("metadata") if isinstance(options, dict) else None, event_id=cid
    )


def _response_cancel(raw: _Raw, cid: str | None) -> Parsed:
    wanted = raw.get("response_id")
    return ResponseCancel(wanted if isinstance(wanted, str) and wanted else None, event_id=cid)


_PARSERS: Final[Mapping[str, Callable[[_Raw, str | None], Parsed]]] = {
    "session.update": _session_update,
    "input_audio_buffer.commit": lambda raw, cid: AudioCommit(event_id=cid),
    "input_audio_buffer.clear": lambda raw, cid: AudioClear(event_id=cid),
    "output_audio_buffer.clear": lambda raw, cid: OutputAudioClear(event_id=cid),
    "conversation.item.create": _item_create,
    "conversation.item.retrieve": _item_retrieve,
    "conversation.item.truncate": _item_truncate,
    "conversation.item.delete": lambda raw, cid: ItemDelete(
        str(raw.get("item_id", "")), event_id=cid
    ),
    "response.create": _response_create,
    "response.cancel": _response_cancel,
}
"""Each GA client event the dialect serves, by its wire ``type``."""
CLIENT_TYPES: Final = frozenset({*_PARSERS, "input_audio_buffer.append"})
"""What the dialect parses; ``realtime.endpoints.OPENAI_CLIENT_TYPES`` lists the same
for the native endpoint's hint (tests/openai/test_hints.py checks they agree)."""


def parse_message(
    frame: str | bytes | None, *, max_bytes: int, input_format: WireFormat = PCM24
) -> Parsed:
    """One client frame as a typed message, or why it is refused; appended audio is
    decoded in ``input_format`` (the session's ``audio.input.format``)."""
    raw = ev.parse_client_event(frame, max_bytes=max_bytes)
    if isinstance(raw, ev.Invalid):
        return raw
    kind: str = raw["type"]
    cid = raw.get("event_id") if isinstance(raw.get("event_id"), str) else None
    if kind == "input_audio_buffer.append":
        return _append(raw, cid, input_format)
    parse = _PARSERS.get(kind)
    if parse is None:
        message = f"unknown client event type {kind!r}"
        if kind in NATIVE_TYPES:
            message += f" (a native VoiceChat message); {NATIVE_PROTOCOL_HINT}"
        return ev.Invalid("unknown_event", message, "type", cid)
    return parse(raw, cid)
