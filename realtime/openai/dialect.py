"""The OpenAI Realtime (GA) dialect of one connection, as a pure state machine.

A full-duplex model has no turns: every 80 ms it hears a frame and speaks a
frame. OpenAI clients think in responses. This module draws the line:

* **A model turn opens** on the first frame whose agent text channel carries a
  real token (not pad, silence, bos or eos: the adapter reports only real ones as
  text deltas), or on a tool call.
* **It closes** on the text channel's end token (``AudioDelta.end_of_turn``) plus
  ``END_TAIL_FRAMES`` more frames, so speech still ringing out of the TTS is
  included; text in the tail cancels the end. A model that never says end gets
  the turn closed after ``QUIET_FRAMES`` frames without text.
* **Between turns** the model's audio (silence, breaths) is resampled, to keep the
  stream continuous, and dropped.
* **The user's turn** starts at the first transcript token (``speech_started``)
  and stops after ``USER_QUIET_FRAMES`` without one (``speech_stopped``,
  ``committed``, the user item, its transcription). With ``turn_detection: null``
  only the client's ``input_audio_buffer.commit`` ends it.

Like :mod:`realtime.conversation`, nothing here does I/O or reads a clock: client
messages, model frames and times come in as calls; events and work for the
plumbing come out as lists. :mod:`realtime.openai.connection` carries them.
"""

from __future__ import annotations

import copy
import json
import math
import re
import reprlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Final

import attrs
import numpy as np

from realtime.close_codes import CLOSE_INTERNAL, CLOSE_POLICY, Close
from realtime.limits import Limits, prompt_refusal
from realtime.models.base import (
    FRAME_SAMPLES,
    INPUT_SAMPLE_RATE,
    AssistantTextDelta,
    AudioDelta,
    FunctionDelta,
    ModelEvent,
    Samples,
    UserTranscriptDelta,
)
from realtime.openai import events as ev
from realtime.openai.audio import (
    AudioFormatError,
    InputFramer,
    OutputResampler,
    decode_pcm16,
    encode_pcm16,
)

FRAME_MS: Final = FRAME_SAMPLES * 1000 // INPUT_SAMPLE_RATE
FRAME_SECONDS: Final = FRAME_SAMPLES / INPUT_SAMPLE_RATE
END_TAIL_FRAMES: Final = 2
"""Frames of audio kept after the end token: the TTS's last syllable rings out."""
QUIET_FRAMES: Final = 25
"""A turn with no text for 2 s ends even without an end token."""
USER_QUIET_FRAMES: Final = 8
"""640 ms with no new user transcript ends the user's turn."""
CREATE_TIMEOUT_FRAMES: Final = 100
"""A ``response.create`` the model leaves unanswered for 8 s ends empty, so client
loops waiting for ``response.done`` never hang."""
SILENCE_SLACK_FRAMES: Final = 2
"""How far the model may fall behind real time before silence is fed: a client
streaming in real time is never interleaved with silence by network jitter."""
MAX_ENGINE_BACKLOG: Final = 2
"""Silence is only fed while the engine keeps up (at most this many frames queued)."""
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

_SESSION_KEYS: Final = frozenset(
    {
        "type",
        "instructions",
        "tools",
        "tool_choice",
        "audio",
        "output_modalities",
        "max_output_tokens",
        "model",
        "include",
        "tracing",
        "truncation",
        "prompt",
    }
)
_AUDIO_KEYS: Final = {
    "input": frozenset({"format", "transcription", "noise_reduction", "turn_detection"}),
    "output": frozenset({"format", "voice", "speed"}),
}
"""The GA ``session.audio`` settings; the dialect keeps no others."""
_FROZEN_KEYS: Final = ("instructions", "tools")
"""Part of the system prompt, which is prefilled once when the model opens."""
_CALL_START: Final = re.compile(r"<SPECIAL_20>|<TOOLCALL>")
_CALL_END: Final = re.compile(r"<SPECIAL_21>|</TOOLCALL>")
_MARKER: Final = re.compile(r"<SPECIAL_\d+>|</?TOOLCALL>|</?TOOL_RESPONSE>")


# --- outputs ---------------------------------------------------------------------------


@attrs.frozen(slots=True)
class OpenModel:
    """Open the model session with this system prompt (``None``: the model's own)."""

    system_prompt: str | None


@attrs.frozen(slots=True, eq=False)
class RunFrame:
    """Run one 1280-sample frame at 16 kHz (client audio, or silence)."""

    samples: Samples
    silence: bool


Output = ev.Event | OpenModel | RunFrame | Close


# --- state ---------------------------------------------------------------------------------


def item_bytes(item: ev.Item) -> int:
    """What an item weighs in memory, near enough: its UTF-8 JSON plus
    ``VALUE_BYTES`` per value."""
    return ev.utf8_size(ev.serialize(item)) + VALUE_BYTES * ev.shape(item).values


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


@attrs.define(slots=True)
class _Message:
    item_id: str
    output_index: int
    transcript: str = ""


@attrs.define(slots=True)
class _Response:
    id: str
    metadata: Any
    output: list[ev.Item] = attrs.Factory(list)
    message: _Message | None = None
    waited: int = 0
    """Frames run since it was created with nothing in it yet."""
    for_call: bool = False
    """Opened by a tool call with no speech: it ends with the call."""


@attrs.define(slots=True)
class _UserTurn:
    item_id: str
    start_frame: int
    transcript: str = ""
    last_frame: int = -1
    committed: bool = False
    quiet: int = 0


def render_prompt(instructions: str | None, tools: list[dict[str, Any]]) -> str | None:
    """The system prompt: the instructions, then the declared tools in the format
    VoiceChat was trained on (``<AVAILABLE_TOOLS>`` in, ``<TOOLCALL>`` out)."""
    if not tools:
        return instructions
    declared = [
        {k: v for k, v in tool.items() if k in ("name", "description", "parameters")}
        for tool in tools
    ]
    listing = json.dumps(declared, ensure_ascii=False, sort_keys=True)
    base = instructions if instructions is not None else ""
    return (
        f"{base}\n\nYou can use the following tools to assist the user if required:\n"
        f"<AVAILABLE_TOOLS>{listing}</AVAILABLE_TOOLS>\n\n"
        "To call tools, answer in this format:\n"
        '<TOOLCALL>[{"name": "tool_name", "arguments": {"arg": "value"}}]</TOOLCALL>\n\n'
        "Tool results come back in this format:\n"
        '<TOOL_RESPONSE>[{"result": "..."}]</TOOL_RESPONSE>'
    ).lstrip()


def parse_calls(text: str) -> list[tuple[str, str]] | None:
    """``(name, arguments JSON)`` of each call in one tool-call payload, or ``None``
    while it does not parse yet."""
    body = _MARKER.sub("", text).strip()
    if not body:
        return None
    try:
        parsed = json.loads(body)
        entries = parsed if isinstance(parsed, list) else [parsed]
        calls = []
        for entry in entries:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                return None
            args = entry.get("arguments", {})
            calls.append((entry["name"], args if isinstance(args, str) else json.dumps(args)))
    except (ValueError, RecursionError):  # RecursionError: nested too deep to parse or dump
        return None
    return calls or None


class Dialect:
    """One ``/openai/v1/realtime`` connection's state. One trio task at a time calls it."""

    def __init__(
        self,
        session_id: str,
        model_id: str,
        limits: Limits,
        *,
        now: float,
        new_id: Callable[[str], str] = ev.new_id,
        count_tokens: Callable[[str], int] = len,
    ) -> None:
        self.session_id = session_id
        self.limits = limits
        self._count_tokens = count_tokens
        """The model's tokenizer: the system prompt's length is checked before it opens."""
        self.session = ev.default_session(session_id, model_id)
        self._new_id = new_id
        self._framer = InputFramer()
        self._resampler = OutputResampler()
        self.model_state = "closed"
        """``closed`` → ``opening`` → ``open`` (or back to ``closed`` when it failed)."""
        self._applied: dict[str, Any] | None = None
        """Instructions and tools as prefilled."""
        self.clock_start: float | None = None
        self.frames_submitted = 0
        self.frames_done = 0
        self._max_backlog = max(1, int(limits.max_pending_audio_seconds / FRAME_SECONDS))
        self.closed = False
        self._last_message = now
        self._sending_since: float | None = None
        self._last_sent = now
        self._closing_since: float | None = None
        """When the dialect decided to close: from then on the close is owed."""
        self._dropped = False
        """The client was dropped for not reading: nothing is left to time."""
        # model side
        self.turn_active = False
        self.muted = False
        self._quiet = 0
        self._tail: int | None = None
        self.response: _Response | None = None
        self._function_text = ""
        self._call_start = 0
        # user side
        self.user: _UserTurn | None = None
        self._settling: _UserTurn | None = None
        self._appended = False
        self._last_item: str | None = None
        self.items = ItemStore()

    # --- helpers ------------------------------------------------------------------------

    @property
    def vad(self) -> bool:
        detection: object = self.session["audio"]["input"]["turn_detection"]
        return detection is not None

    @property
    def text_only(self) -> bool:
        modalities: object = self.session["output_modalities"]
        return modalities == ["text"]

    def _added(self, item: ev.Item, done: bool = False, *, size: int | None = None) -> ev.Event:
        """``conversation.item.added`` (or ``.done``) for ``item``, which is stored;
        ``size``: its :func:`item_bytes`, when already known."""
        event = ev.event(
            "conversation.item.done" if done else "conversation.item.added",
            item=copy.deepcopy(item),
        )
        if not done:
            if self._last_item is not None:
                event["previous_item_id"] = self._last_item
            self._last_item = item["id"]
        self.items.put(item, size)
        return event

    # --- client messages -------------------------------------------------------------------

    def receive(self, frame: str | bytes | None, now: float) -> list[Output]:
        self._last_message = now
        if self.closed:
            return []
        message = ev.parse_client_event(frame, max_bytes=self.limits.max_message_bytes)
        if isinstance(message, ev.Invalid):
            return [ev.error(message.message, code=message.code)]
        kind: str = message["type"]
        client_id = message.get("event_id") if isinstance(message.get("event_id"), str) else None
        if kind not in ev.CLIENT_TYPES:
            return [
                ev.error(
                    f"unknown client event type {kind!r}",
                    code="unknown_event",
                    param="type",
                    client_event_id=client_id,
                )
            ]
        handler = getattr(self, "_on_" + kind.replace(".", "_"))
        out: list[Output] = handler(message, client_id)
        return out

    def _on_session_update(self, message: dict[str, Any], cid: str | None) -> list[Output]:
        update = message.get("session")
        if not isinstance(update, dict):
            return [
                ev.error(
                    "session.update needs a 'session' object",
                    code="invalid_value",
                    param="session",
                    client_event_id=cid,
                )
            ]
        if update.get("type", "realtime") != "realtime":
            return [
                ev.error(
                    "this server serves realtime sessions only (type: 'realtime')",
                    code="invalid_value",
                    param="session.type",
                    client_event_id=cid,
                )
            ]
        merged = copy.deepcopy(self.session)
        for key, value in update.items():
            if key not in _SESSION_KEYS or key in ("type", "model"):
                continue
            if key == "audio":
                problem = self._merge_audio(merged["audio"], value)
                if problem is not None:
                    return [
                        ev.error(
                            problem[1], code="invalid_value", param=problem[0], client_event_id=cid
                        )
                    ]
            else:
                merged[key] = value
        problem = _check_session(merged)
        if problem is not None:
            return [
                ev.error(problem[1], code="invalid_value", param=problem[0], client_event_id=cid)
            ]
        if self._applied is not None:
            changed = [k for k in _FROZEN_KEYS if merged.get(k) != self._applied.get(k)]
            if changed:
                return [
                    ev.error(
                        f"{' and '.join(changed)} cannot change once the model has started: "
                        "they are part of the system prompt it was opened with. Send them in "
                        "the first session.update, before any audio or response.create; this "
                        "update was not applied",
                        code="session_already_started",
                        param=f"session.{changed[0]}",
                        client_event_id=cid,
                    )
                ]
        if any(merged.get(k) != self.session.get(k) for k in _FROZEN_KEYS):
            refusal = prompt_refusal(
                _system_prompt(merged),
                self.limits.max_system_prompt_tokens,
                self._count_tokens,
                field="session.instructions" + (" with the tools" if merged["tools"] else ""),
            )
            if refusal is not None:
                return [
                    ev.error(
                        f"{refusal}; this update was not applied",
                        code="invalid_value",
                        param="session.instructions",
                        client_event_id=cid,
                    )
                ]
        self.session = merged
        return [ev.session_event("session.updated", self.session)]

    def _merge_audio(self, audio: dict[str, Any], value: object) -> tuple[str, str] | None:
        if not isinstance(value, dict):
            return "session.audio", "audio must be an object"
        for side in ("input", "output"):
            part = value.get(side)
            if part is None:
                continue
            if not isinstance(part, dict):
                return f"session.audio.{side}", f"audio.{side} must be an object"
            for key, setting in part.items():
                if key == "format":
                    fmt = setting if isinstance(setting, dict) else {}
                    if fmt.get("type") != "audio/pcm" or fmt.get("rate", 24000) != 24000:
                        return (
                            f"session.audio.{side}.format",
                            f"only {{'type': 'audio/pcm', 'rate': 24000}} is served; got "
                            f"{reprlib.repr(setting)}",
                        )
                    audio[side]["format"] = dict(ev.PCM_FORMAT)
                elif key == "turn_detection" and side == "input":
                    if setting is not None and not (
                        isinstance(setting, dict)
                        and setting.get("type") in ("server_vad", "semantic_vad")
                    ):
                        return (
                            "session.audio.input.turn_detection",
                            "turn_detection must be null, server_vad or semantic_vad",
                        )
                    audio["input"]["turn_detection"] = setting
                elif key in _AUDIO_KEYS[side]:
                    audio[side][key] = setting
                # Other keys are ignored, as unknown session keys are: were they kept,
                # each update could add one more to the session and every session.updated.
        return None

    def _ensure_open(self) -> list[Output]:
        if self.model_state != "closed":
            return []
        self.model_state = "opening"
        self._applied = {
            "instructions": self.session.get("instructions"),
            "tools": self.session.get("tools"),
        }
        return [OpenModel(_system_prompt(self.session))]

    def _on_input_audio_buffer_append(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        try:
            samples = decode_pcm16(message.get("audio"))
        except AudioFormatError as exc:
            return [ev.error(str(exc), code="invalid_value", param="audio", client_event_id=cid)]
        backlog = self.frames_submitted - self.frames_done
        if backlog >= self._max_backlog:
            return [
                ev.error(
                    f"input audio backlog is full ({backlog * FRAME_SECONDS:.2f} s waiting for "
                    "the model); send audio no faster than real time",
                    code="input_audio_buffer_full",
                    client_event_id=cid,
                )
            ]
        out = self._ensure_open()
        if samples.shape[0]:
            self._appended = True
        for frame in self._framer.push(samples):
            out.append(self._frame(frame, silence=False))
        return out

    def _frame(self, samples: Samples, *, silence: bool) -> RunFrame:
        self.frames_submitted += 1
        return RunFrame(samples, silence)

    def _on_input_audio_buffer_commit(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        user = self.user
        if not self._appended and user is None:
            return [
                ev.error(
                    "the input audio buffer is empty: append audio before committing",
                    code="input_audio_buffer_commit_empty",
                    client_event_id=cid,
                )
            ]
        self._appended = False
        return self._commit_user(settle=True)

    def _on_input_audio_buffer_clear(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        self._framer.drop_partial()
        self._appended = False
        self.user = None
        return [ev.event("input_audio_buffer.cleared")]

    def _on_output_audio_buffer_clear(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        # The server keeps no output buffer (audio goes out as it is made): cutting
        # the current response is response.cancel's job. Acknowledged, not refused.
        rid = self.response.id if self.response is not None else "resp_none"
        return [ev.event("output_audio_buffer.cleared", response_id=rid)]

    def _on_conversation_item_create(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        item = message.get("item")
        if not isinstance(item, dict) or not isinstance(item.get("type"), str):
            return [
                ev.error(
                    "conversation.item.create needs an 'item' object",
                    code="invalid_value",
                    param="item",
                    client_event_id=cid,
                )
            ]
        if "id" in item and (not isinstance(item["id"], str) or not item["id"]):
            return [
                ev.error(
                    "an item's id is a non-empty string",
                    code="invalid_value",
                    param="item.id",
                    client_event_id=cid,
                )
            ]
        stored = item  # parsed for this message alone: nothing else holds it
        stored.setdefault("id", self._new_id("item"))
        stored.setdefault("object", "realtime.item")
        stored.setdefault("status", "completed")
        if stored["type"] == "message":
            stored.setdefault("content", [])
        size = item_bytes(stored)
        if size > MAX_ITEM_BYTES:
            return [
                ev.error(
                    f"the item weighs {size} bytes (its JSON, plus {VALUE_BYTES} per value), "
                    f"over the {MAX_ITEM_BYTES}-byte limit for one item; it was not added",
                    code="invalid_value",
                    param="item",
                    client_event_id=cid,
                )
            ]
        # The model hears audio only: a text message or a tool result is kept in
        # the conversation (and acknowledged) but does not reach it yet.
        return [self._added(stored, size=size), self._added(stored, done=True)]

    def _on_conversation_item_retrieve(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        item = self.items.get(str(message.get("item_id")))
        if item is None:
            return [
                ev.error(
                    f"no item {message.get('item_id')!r} in this conversation",
                    code="item_not_found",
                    param="item_id",
                    client_event_id=cid,
                )
            ]
        return [ev.event("conversation.item.retrieved", item=copy.deepcopy(item))]

    def _on_conversation_item_truncate(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        # The model keeps what it said; the server only acknowledges the client's cut.
        end = message.get("audio_end_ms")
        index = message.get("content_index")
        return [
            ev.event(
                "conversation.item.truncated",
                item_id=str(message.get("item_id", "")),
                content_index=index if isinstance(index, int) else 0,
                audio_end_ms=end if isinstance(end, int) and end >= 0 else 0,
            )
        ]

    def _on_conversation_item_delete(
        self, message: dict[str, Any], cid: str | None
    ) -> list[Output]:
        item_id = str(message.get("item_id", ""))
        self.items.pop(item_id)
        return [ev.event("conversation.item.deleted", item_id=item_id)]

    def _on_response_create(self, message: dict[str, Any], cid: str | None) -> list[Output]:
        if self.response is not None:
            return [
                ev.error(
                    f"conversation already has an active response {self.response.id}",
                    code="conversation_already_has_active_response",
                    client_event_id=cid,
                )
            ]
        options = message.get("response")
        metadata = options.get("metadata") if isinstance(options, dict) else None
        out = self._ensure_open()
        out += self._open_response(metadata)
        if self.turn_active and not self.muted:
            # The model is already speaking: this response carries the rest of it.
            out += self._open_message()
        return out

    def _on_response_cancel(self, message: dict[str, Any], cid: str | None) -> list[Output]:
        wanted = message.get("response_id")
        resp = self.response
        if resp is None or (isinstance(wanted, str) and wanted and wanted != resp.id):
            return [
                ev.error(
                    "there is no active response to cancel",
                    code="response_cancel_not_active",
                    client_event_id=cid,
                )
            ]
        if self.turn_active:
            self.muted = True  # the model cannot be interrupted: the rest of its turn is dropped
        return self._finish_response("cancelled", reason="client_cancelled")

    # --- responses ------------------------------------------------------------------------

    def _modalities(self) -> list[str]:
        return list(self.session["output_modalities"])

    def _open_response(self, metadata: Any = None, *, for_call: bool = False) -> list[Output]:
        self.response = _Response(self._new_id("resp"), metadata, for_call=for_call)
        body = ev.response(
            self.response.id, "in_progress", [], modalities=self._modalities(), metadata=metadata
        )
        return [ev.event("response.created", response=body)]

    def _part_fields(self, resp: _Response, msg: _Message) -> dict[str, Any]:
        return {
            "response_id": resp.id,
            "item_id": msg.item_id,
            "output_index": msg.output_index,
            "content_index": 0,
        }

    def _open_message(self) -> list[Output]:
        resp = self.response
        assert resp is not None
        msg = _Message(self._new_id("item"), len(resp.output))
        resp.message = msg
        resp.for_call = False
        item = ev.assistant_message(msg.item_id, "in_progress", transcript=None)
        resp.output.append(item)
        part = (
            {"type": "text", "text": ""} if self.text_only else {"type": "audio", "transcript": ""}
        )
        return [
            ev.event(
                "response.output_item.added",
                response_id=resp.id,
                output_index=msg.output_index,
                item=copy.deepcopy(item),
            ),
            self._added(item),
            ev.event("response.content_part.added", part=part, **self._part_fields(resp, msg)),
        ]

    def _close_message(self, status: str) -> list[Output]:
        resp = self.response
        if resp is None or resp.message is None:
            return []
        msg, resp.message = resp.message, None
        fields = self._part_fields(resp, msg)
        text = self.text_only
        item = ev.assistant_message(msg.item_id, status, transcript=msg.transcript, text=text)
        resp.output[msg.output_index] = item
        if text:
            out: list[Output] = [
                ev.event("response.output_text.done", text=msg.transcript, **fields)
            ]
            part = {"type": "text", "text": msg.transcript}
        else:
            out = [
                ev.event("response.output_audio.done", **fields),
                ev.event(
                    "response.output_audio_transcript.done", transcript=msg.transcript, **fields
                ),
            ]
            part = {"type": "audio", "transcript": msg.transcript}
        out += [
            ev.event("response.content_part.done", part=part, **fields),
            ev.event(
                "response.output_item.done",
                response_id=resp.id,
                output_index=msg.output_index,
                item=copy.deepcopy(item),
            ),
            self._added(item, done=True),
        ]
        return out

    def _finish_response(self, status: str, reason: str | None = None) -> list[Output]:
        resp = self.response
        if resp is None:
            return []
        out = self._close_message("completed" if status == "completed" else "incomplete")
        self.response = None
        body = ev.response(
            resp.id,
            status,
            copy.deepcopy(resp.output),
            modalities=self._modalities(),
            metadata=resp.metadata,
            reason=reason,
        )
        out.append(ev.event("response.done", response=body))
        out.append(ev.event("rate_limits.updated", rate_limits=[]))
        return out

    # --- the model's side -------------------------------------------------------------------

    def opened(self, failure: str | None, now: float) -> list[Output]:
        """The engine finished opening the model session (``failure``: why not)."""
        if failure is not None:
            self.model_state = "closed"
            self._applied = None
            out: list[Output] = [
                ev.error(
                    f"the model session could not be opened: {failure}",
                    code="session_initialization_failed",
                    type_="server_error",
                )
            ]
            if self.response is not None:
                out += self._finish_response("failed")
            return out
        self.model_state = "open"
        self.clock_start = now
        return []

    def frame_dropped(self) -> None:
        """A frame queued for the model did not run (the session is not open)."""
        self.frames_done += 1

    def frame_done(self, events: list[ModelEvent]) -> list[Output]:
        """One frame's events: the dialect's responses and user items for it."""
        self.frames_done += 1
        audio: AudioDelta | None = None
        text: list[AssistantTextDelta] = []
        functions: list[FunctionDelta] = []
        heard: list[UserTranscriptDelta] = []
        for event in events:
            if isinstance(event, AudioDelta):
                audio = event
            elif isinstance(event, AssistantTextDelta):
                text.append(event)
            elif isinstance(event, FunctionDelta):
                functions.append(event)
            elif isinstance(event, UserTranscriptDelta):
                heard.append(event)
        frame = audio.frame_index if audio is not None else self.frames_done - 1
        out = self._hear(heard, frame)
        spoken = "".join(t.delta for t in text)
        opening: list[Output] = []
        if text:
            self._quiet = 0
            self._tail = None
            if not self.turn_active:
                self.turn_active = True
            if not self.muted:
                if self.vad and self.user is not None and self.user.last_frame >= 0:
                    # The model answering ends the user's turn: commit it first, as
                    # OpenAI does; late transcript still settles into it.
                    opening += self._commit_user(settle=True)
                opening += self._speak()
        elif self.turn_active:
            self._quiet += 1
        out += opening
        resp = self.response
        msg = resp.message if resp is not None else None
        if audio is not None:
            pcm = self._resampler.push(audio.samples, audio.sample_rate)
            if resp is not None and msg is not None and not self.text_only:
                out.append(
                    ev.event(
                        "response.output_audio.delta",
                        delta=encode_pcm16(pcm),
                        **self._part_fields(resp, msg),
                    )
                )
        if resp is not None and msg is not None and spoken:
            msg.transcript += spoken
            kind = (
                "response.output_text.delta"
                if self.text_only
                else ("response.output_audio_transcript.delta")
            )
            out.append(ev.event(kind, delta=spoken, **self._part_fields(resp, msg)))
        for fn in functions:
            out += self._function(fn.delta)
        if self.response is not None and self.response.message is None and not self.turn_active:
            self.response.waited += 1
            if self.response.waited >= CREATE_TIMEOUT_FRAMES:
                out += self._finish_response("completed")
        out += self._maybe_end_turn(audio)
        return out

    def _speak(self) -> list[Output]:
        out: list[Output] = []
        if self.response is None:
            out += self._open_response()
        if self.response is not None and self.response.message is None:
            out += self._open_message()
        return out

    def _maybe_end_turn(self, audio: AudioDelta | None) -> list[Output]:
        if not self.turn_active:
            return []
        if audio is not None and audio.end_of_turn and self._tail is None:
            self._tail = END_TAIL_FRAMES + 1
        if self._tail is not None:
            self._tail -= 1
        if (self._tail is not None and self._tail <= 0) or self._quiet >= QUIET_FRAMES:
            self.turn_active = False
            self._tail = None
            self._quiet = 0
            was_muted, self.muted = self.muted, False
            if not was_muted and self.response is not None and self.response.message is not None:
                return self._finish_response("completed")
        return []

    def _function(self, delta: str) -> list[Output]:
        self._function_text += delta
        pending = self._function_text[self._call_start :]
        start = _CALL_START.search(pending)
        end = _CALL_END.search(pending)
        if start is not None and end is None:
            return []  # a marked call is still arriving
        payload = pending[start.end() if start else 0 : end.start() if end else len(pending)]
        calls = parse_calls(payload)
        if calls is None:
            if end is not None:  # a malformed marked call: skip it
                self._call_start += end.end()
            return []
        self._call_start = len(self._function_text)
        out: list[Output] = []
        if self.response is None:
            out += self._open_response(for_call=True)
        resp = self.response
        assert resp is not None
        for name, arguments in calls:
            item_id, call_id = self._new_id("item"), self._new_id("call")
            index = len(resp.output)
            item = ev.function_call(item_id, call_id, name, "", "in_progress")
            resp.output.append(item)
            done = ev.function_call(item_id, call_id, name, arguments, "completed")
            resp.output[index] = done
            common = {
                "response_id": resp.id,
                "item_id": item_id,
                "output_index": index,
                "call_id": call_id,
            }
            out += [
                ev.event(
                    "response.output_item.added",
                    response_id=resp.id,
                    output_index=index,
                    item=copy.deepcopy(item),
                ),
                self._added(item),
                ev.event("response.function_call_arguments.delta", delta=arguments, **common),
                ev.event(
                    "response.function_call_arguments.done",
                    name=name,
                    arguments=arguments,
                    **common,
                ),
                ev.event(
                    "response.output_item.done",
                    response_id=resp.id,
                    output_index=index,
                    item=copy.deepcopy(done),
                ),
                self._added(done, done=True),
            ]
        if resp.for_call:
            out += self._finish_response("completed")
        return out

    # --- the user's side ------------------------------------------------------------------

    def _hear(self, heard: list[UserTranscriptDelta], frame: int) -> list[Output]:
        out: list[Output] = []
        said = "".join(h.delta for h in heard)
        settling = self._settling
        if settling is not None:
            if said:
                settling.transcript += said
                settling.quiet = 0
                said = ""
            else:
                settling.quiet += 1
            if settling.quiet >= USER_QUIET_FRAMES:
                out += self._transcribed(settling)
        if said:
            if self.user is None:
                self.user = _UserTurn(self._new_id("item"), frame)
                if self.vad:
                    out.append(
                        ev.event(
                            "input_audio_buffer.speech_started",
                            item_id=self.user.item_id,
                            audio_start_ms=frame * FRAME_MS,
                        )
                    )
            self.user.transcript += said
            self.user.last_frame = frame
            self.user.quiet = 0
        elif self.user is not None and self.user.last_frame >= 0:
            self.user.quiet += 1
            if self.vad and self.user.quiet >= USER_QUIET_FRAMES:
                out += self._commit_user(settle=False)
        return out

    def _commit_user(self, *, settle: bool) -> list[Output]:
        user = self.user
        out: list[Output] = []
        if user is None:
            user = _UserTurn(self._new_id("item"), self.frames_done)
        elif self.vad and user.last_frame >= 0:
            out.append(
                ev.event(
                    "input_audio_buffer.speech_stopped",
                    item_id=user.item_id,
                    audio_end_ms=(user.last_frame + 1) * FRAME_MS,
                )
            )
        self.user = None
        if self._settling is not None:
            out += self._transcribed(self._settling)
        committed = ev.event("input_audio_buffer.committed", item_id=user.item_id)
        if self._last_item is not None:
            committed["previous_item_id"] = self._last_item
        out.append(committed)
        out.append(self._added(ev.user_message(user.item_id, None)))
        user.committed = True
        if settle:
            # Transcript lags the audio: tokens in the next frames still belong here.
            self._settling = user
        else:
            out += self._transcribed(user)
        return out

    def _transcribed(self, user: _UserTurn) -> list[Output]:
        if self._settling is user:
            self._settling = None
        out: list[Output] = []
        fields = {"item_id": user.item_id, "content_index": 0}
        if user.transcript:
            out.append(
                ev.event(
                    "conversation.item.input_audio_transcription.delta",
                    delta=user.transcript,
                    **fields,
                )
            )
        seconds = max(user.last_frame + 1 - user.start_frame, 0) * FRAME_SECONDS
        out.append(
            ev.event(
                "conversation.item.input_audio_transcription.completed",
                transcript=user.transcript,
                usage={"type": "duration", "seconds": round(seconds, 3)},
                **fields,
            )
        )
        out.append(self._added(ev.user_message(user.item_id, user.transcript), done=True))
        return out

    # --- time ---------------------------------------------------------------------------------

    def sending(self, now: float) -> None:
        """A socket write starts (the stalled-reader clock runs until ``sent``)."""
        self._sending_since = now

    def sent(self, now: float) -> None:
        self._sending_since = None
        self._last_sent = now

    def _close(self, now: float) -> None:
        """Stop serving the client: from ``now`` on only the close is owed it."""
        self.closed = True
        if self._closing_since is None:
            self._closing_since = now

    def stall_deadline(self) -> float | None:
        """When a client that reads nothing is dropped (``None``: nothing is owed it).

        ``send_timeout`` after the write under way began, in every phase; and once
        closing, after the later of the close decision and the last write done: the
        close (and what is queued ahead of it) is owed then, even while no write is
        reported under way (the plumbing does not report a close frame's).
        """
        if self._dropped:
            return None
        timeout = self.limits.send_timeout
        deadlines = []
        if self._sending_since is not None:
            deadlines.append(self._sending_since + timeout)
        if self._closing_since is not None:
            deadlines.append(max(self._closing_since, self._last_sent) + timeout)
        return min(deadlines, default=None)

    def tick(self, now: float) -> list[Output]:
        """Silence to keep the model's clock running; the stalled-reader and idle
        timeouts."""
        stall = self.stall_deadline()
        if stall is not None and now >= stall:
            self._close(now)
            self._dropped = True
            return [Close(CLOSE_POLICY, "client stopped reading", now=True)]
        if self.closed:
            return []
        if now - self._last_message >= self.limits.idle_timeout:
            self._close(now)
            message = f"no client event for {self.limits.idle_timeout:g} s; closing"
            return [ev.error(message, code="idle_timeout"), Close(CLOSE_POLICY, message)]
        if self.model_state != "open" or self.clock_start is None:
            return []
        due = math.floor((now - self.clock_start) / FRAME_SECONDS) - SILENCE_SLACK_FRAMES
        out: list[Output] = []
        while (
            self.frames_submitted < due
            and self.frames_submitted - self.frames_done < MAX_ENGINE_BACKLOG
        ):
            out.append(self._frame(_SILENCE, silence=True))
        return out

    def next_tick(self, now: float) -> float:
        """When ``tick`` next has something to do (at the latest). Once closing only
        the stalled-reader deadline is left: the idle one has passed or no longer
        applies, and a time already past would spin the clock."""
        stall = self.stall_deadline()
        if self.closed:
            return stall if stall is not None else math.inf
        idle = self._last_message + self.limits.idle_timeout
        if stall is not None:
            idle = min(idle, stall)
        if self.model_state != "open" or self.clock_start is None:
            return idle
        frame = (
            self.clock_start + (self.frames_submitted + SILENCE_SLACK_FRAMES + 1) * FRAME_SECONDS
        )
        return min(idle, max(frame, now + FRAME_SECONDS / 4))

    def failed(self, message: str, *, lost: bool, now: float) -> list[Output]:
        """The engine failed a frame; a lost session ends the connection."""
        out: list[Output] = [
            ev.error(f"the model failed: {message}", code="inference_error", type_="server_error")
        ]
        if lost:
            if self.response is not None:
                out += self._finish_response("failed")
            self._close(now)
            out.append(Close(CLOSE_INTERNAL, message[:120]))
        return out


_SILENCE: Final = np.zeros(FRAME_SAMPLES, np.float32)


def _system_prompt(session: dict[str, Any]) -> str | None:
    """What the model is opened with: the session's instructions and its tools."""
    tools = [t for t in session.get("tools") or [] if isinstance(t, dict)]
    return render_prompt(session.get("instructions"), tools)


def _check_session(session: dict[str, Any]) -> tuple[str, str] | None:
    """What is wrong with a merged session, as (param, message), or None."""
    if session.get("instructions") is not None and not isinstance(session["instructions"], str):
        return "session.instructions", "instructions must be a string"
    tools = session.get("tools")
    if not isinstance(tools, list):
        return "session.tools", "tools must be a list"
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            return f"session.tools[{i}]", "only function tools are served"
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            return f"session.tools[{i}].name", "a function tool needs a name"
    modalities = session.get("output_modalities")
    if modalities not in (["audio"], ["text"]):
        return "session.output_modalities", "output_modalities is ['audio'] or ['text']"
    return None
