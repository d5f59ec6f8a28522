"""The one active response: what it holds, and every step of its life as events.

A response opens on ``response.create``, on a model turn that finds none open, or
on a tool call made outside speech (that one ends with its call). It holds at most
one assistant message at a time (the model's speech) and the function calls made
meanwhile; it ends completed when the turn ends, cancelled, failed with the
engine, or empty when the model stays silent for ``CREATE_TIMEOUT_FRAMES``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs

from realtime.models.base import Samples
from realtime.openai import events as ev
from realtime.openai import render
from realtime.openai.audio import encode_pcm16
from realtime.openai.items import ItemLog
from realtime.openai.tools import Call

CREATE_TIMEOUT_FRAMES: Final = 100
"""A ``response.create`` the model leaves unanswered for 8 s ends empty, so client
loops waiting for ``response.done`` never hang."""


@attrs.define(slots=True)
class _Message:
    part: render.Part
    transcript: str = ""


@attrs.define(slots=True)
class Response:
    id: str
    metadata: Any
    output: list[ev.Item] = attrs.Factory(list)
    message: _Message | None = None
    waited: int = 0
    """Frames run since it was created with nothing in it yet."""
    for_call: bool = False
    """Opened by a tool call with no speech: it ends with the call."""


class Responses:
    """The active response (``active``; ``None`` between responses). Each step takes
    the session's ``output_modalities`` as they are now: an update may change them
    between a message's start and its end."""

    def __init__(self, new_id: Callable[[str], str], log: ItemLog) -> None:
        self._new_id = new_id
        self._log = log
        self.active: Response | None = None

    @property
    def speaking(self) -> bool:
        """The active response has a message open (the model's speech goes to it)."""
        return self.active is not None and self.active.message is not None

    def open(
        self, modalities: list[str], metadata: Any = None, *, for_call: bool = False
    ) -> list[ev.Event]:
        self.active = Response(self._new_id("resp"), metadata, for_call=for_call)
        return [render.response_created(self.active.id, modalities, metadata)]

    def speak(self, modalities: list[str]) -> list[ev.Event]:
        """The model speaks: a response (if none is active) and a message in it."""
        out: list[ev.Event] = []
        if self.active is None:
            out += self.open(modalities)
        if self.active is not None and self.active.message is None:
            out += self.open_message(modalities)
        return out

    def open_message(self, modalities: list[str]) -> list[ev.Event]:
        resp = self.active
        assert resp is not None
        part = render.Part(resp.id, self._new_id("item"), len(resp.output))
        resp.message = _Message(part)
        resp.for_call = False
        item = ev.assistant_message(part.item_id, "in_progress", transcript=None)
        resp.output.append(item)
        return render.message_opened(part, item, self._log, text=_text(modalities))

    def audio(self, pcm: Samples, modalities: list[str]) -> list[ev.Event]:
        """One frame of the model's audio (at 24 kHz), for an audio message."""
        msg = self.active.message if self.active is not None else None
        if msg is None or _text(modalities):
            return []
        return [render.audio_delta(msg.part, encode_pcm16(pcm))]

    def said(self, spoken: str, modalities: list[str]) -> list[ev.Event]:
        """What the model said on one frame, for the open message."""
        msg = self.active.message if self.active is not None else None
        if msg is None or not spoken:
            return []
        msg.transcript += spoken
        return [render.text_delta(msg.part, spoken, text=_text(modalities))]

    def calls(self, calls: list[Call], modalities: list[str]) -> list[ev.Event]:
        """Complete tool calls: items of the active response, or of one of their own."""
        out: list[ev.Event] = []
        if self.active is None:
            out += self.open(modalities, for_call=True)
        resp = self.active
        assert resp is not None
        for name, arguments in calls:
            item_id, call_id = self._new_id("item"), self._new_id("call")
            index = len(resp.output)
            added = ev.function_call(item_id, call_id, name, "", "in_progress")
            done = ev.function_call(item_id, call_id, name, arguments, "completed")
            resp.output.append(done)
            out += render.function_call(resp.id, index, added, done, self._log)
        if resp.for_call:
            out += self.finish("completed", modalities)
        return out

    def waited(self, modalities: list[str]) -> list[ev.Event]:
        """A frame passed with the model silent: a response still empty after
        ``CREATE_TIMEOUT_FRAMES`` of them ends."""
        resp = self.active
        if resp is None or resp.message is not None:
            return []
        resp.waited += 1
        if resp.waited < CREATE_TIMEOUT_FRAMES:
            return []
        return self.finish("completed", modalities)

    def finish(
        self, status: render.Status, modalities: list[str], *, reason: str | None = None
    ) -> list[ev.Event]:
        """End the active response (if any), its message first."""
        resp = self.active
        if resp is None:
            return []
        out = self._close_message(
            resp, "completed" if status == "completed" else "incomplete", modalities
        )
        self.active = None
        out += render.response_done(
            resp.id,
            status,
            resp.output,
            modalities=modalities,
            metadata=resp.metadata,
            reason=reason,
        )
        return out

    def _close_message(self, resp: Response, status: str, modalities: list[str]) -> list[ev.Event]:
        msg, resp.message = resp.message, None
        if msg is None:
            return []
        text = _text(modalities)
        item = ev.assistant_message(msg.part.item_id, status, transcript=msg.transcript, text=text)
        resp.output[msg.part.output_index] = item
        return render.message_closed(msg.part, item, msg.transcript, self._log, text=text)


def _text(modalities: list[str]) -> bool:
    """Whether the model's speech goes out as text alone (no audio)."""
    return modalities == ["text"]
