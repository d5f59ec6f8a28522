"""The one active response: what it holds, and every step of its life as events.

A response opens on ``response.create``; with server VAD and ``create_response``
also on a model turn that finds none open, or on a tool call made outside speech
(that one ends with its call). It holds at most one assistant message at a time
(the model's speech) and the function calls made meanwhile; it ends completed
when the turn ends, cancelled, failed with the engine, or empty when the model
stays silent for ``CREATE_TIMEOUT_FRAMES`` after it was asked.

Where only the client opens responses, a turn that began before one was asked for
is held here (as :class:`FrameOutput`, at most ``HELD_FRAMES`` of them), so that a
response asked for while it is still under way carries it from its first frame.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs

from realtime.models.base import Samples
from realtime.models.voicechat.tools import Call
from realtime.openai import events as ev
from realtime.openai import render
from realtime.openai.items import ItemLog
from realtime.openai.usage import Context, Made, usage
from realtime.wire_audio import PCM24, WireFormat

CREATE_TIMEOUT_FRAMES: Final = 100
"""A ``response.create`` the model leaves unanswered for 8 s of its frames (counted
once it has heard what the client sent before it) ends empty, so client loops
waiting for ``response.done`` never hang."""
HELD_FRAMES: Final = 125
"""At most 10 s of a held turn are kept (about 1 MB of 24 kHz float32 audio); a
longer one is given up and runs unheard."""


@attrs.frozen(slots=True, eq=False)
class FrameOutput:
    """What the model made on one frame for the client (kept as is in a held turn)."""

    pcm: Samples | None
    """The model's audio at ``wire.rate`` (``None``: the frame had none)."""
    spoken: str
    calls: tuple[Call, ...]
    spoken_tokens: int = 0
    """Text-channel tokens behind ``spoken``."""
    call_tokens: int = 0
    """Function-channel tokens behind ``calls`` (since the call before them)."""
    wire: WireFormat = PCM24
    """The output format ``pcm`` was resampled for, and is sent in (a held frame keeps
    the format it was made in, should the session's change before it is sent)."""


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
    """Frames run since ``after`` with no message in it yet."""
    for_call: bool = False
    """Opened by a tool call with no speech: it ends with the call."""
    after: int = 0
    """The first model frame that counts for it: the frames queued when the client
    created it, so that the model has heard everything sent before."""
    made: Made = attrs.Factory(Made)
    """What the model made for it (its ``usage`` output)."""


class Responses:
    """The active response (``active``; ``None`` between responses). Each step takes
    the session's ``output_modalities`` as they are now: an update may change them
    between a message's start and its end."""

    def __init__(
        self, new_id: Callable[[str], str], log: ItemLog, context: Context | None = None
    ) -> None:
        self.output_format = PCM24
        """``session.audio.output.format`` now, echoed in each response object."""
        self._new_id = new_id
        self._log = log
        self.context = context if context is not None else Context()
        """The session's model context, every response's ``usage`` input."""
        self.active: Response | None = None
        self._held: list[FrameOutput] = []

    @property
    def speaking(self) -> bool:
        """The active response has a message open (the model's speech goes to it)."""
        return self.active is not None and self.active.message is not None

    def counts(self, frame: int) -> bool:
        """A response is active and model frame ``frame`` (its number) came after the
        client asked for it."""
        resp = self.active
        return resp is not None and frame >= resp.after

    def ready(self, frame: int) -> bool:
        """A response waits for a turn, and ``frame`` counts for it."""
        resp = self.active
        return resp is not None and resp.message is None and frame >= resp.after

    def open(
        self,
        modalities: list[str],
        metadata: Any = None,
        *,
        for_call: bool = False,
        after: int = 0,
    ) -> list[ev.Event]:
        self.active = Response(self._new_id("resp"), metadata, for_call=for_call, after=after)
        return [render.response_created(self.active.id, modalities, metadata, self.output_format)]

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

    def hold(self, frame: FrameOutput) -> bool:
        """Keep one frame of the held turn; False (and nothing kept) once the turn
        outgrows ``HELD_FRAMES``."""
        self._held.append(frame)
        if len(self._held) <= HELD_FRAMES:
            return True
        self._held.clear()
        return False

    def drop_held(self) -> None:
        """The held turn ended (or was given up) unclaimed: it is never sent."""
        self._held.clear()

    def claim(self, modalities: list[str]) -> list[ev.Event]:
        """The active response takes the held turn: a message, then every held frame
        as it would have gone out."""
        out = self.open_message(modalities)
        held, self._held = self._held, []
        for frame in held:
            out += self.frame(frame, modalities)
        return out

    def frame(self, frame: FrameOutput, modalities: list[str]) -> list[ev.Event]:
        """One frame's output for the active response (``calls`` may open one)."""
        out = [] if frame.pcm is None else self.audio(frame.pcm, modalities, frame.wire)
        if out and self.active is not None:
            self.active.made.audio_frames += 1
        said = self.said(frame.spoken, modalities)
        if said and self.active is not None:
            self.active.made.text_tokens += frame.spoken_tokens
        out += said
        if frame.calls:
            out += self.calls(list(frame.calls), modalities, tokens=frame.call_tokens)
        return out

    def audio(
        self, pcm: Samples, modalities: list[str], wire: WireFormat = PCM24
    ) -> list[ev.Event]:
        """One frame of the model's audio (at ``wire.rate``), for an audio message,
        encoded in ``wire`` (only here: a frame that reaches no client costs no encoding)."""
        msg = self.active.message if self.active is not None else None
        if msg is None or _text(modalities):
            return []
        return [render.audio_delta(msg.part, wire.encode(pcm))]

    def said(self, spoken: str, modalities: list[str]) -> list[ev.Event]:
        """What the model said on one frame, for the open message."""
        msg = self.active.message if self.active is not None else None
        if msg is None or not spoken:
            return []
        msg.transcript += spoken
        return [render.text_delta(msg.part, spoken, text=_text(modalities))]

    def calls(self, calls: list[Call], modalities: list[str], *, tokens: int = 0) -> list[ev.Event]:
        """Complete tool calls (``tokens``: the function-channel tokens that made them):
        items of the active response, or of one of their own."""
        out: list[ev.Event] = []
        if self.active is None:
            out += self.open(modalities, for_call=True)
        resp = self.active
        assert resp is not None
        resp.made.text_tokens += tokens
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

    def waited(self, frame: int, modalities: list[str]) -> list[ev.Event]:
        """Model frame ``frame`` passed: a response with no message after
        ``CREATE_TIMEOUT_FRAMES`` of them (from its ``after``) ends. A muted turn
        still running counts too: it will never fill the response."""
        if not self.ready(frame):
            return []
        resp = self.active
        assert resp is not None
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
            output_format=self.output_format,
            usage=usage(self.context, resp.made),
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
