"""The dialect's server events, in the order and with the fields the GA clients
expect of each step: a response's message opening and closing, its deltas, a
function call, a response's end, the user's turn.

Pure builders over :mod:`realtime.openai.events`; the one state they touch is the
:class:`~realtime.openai.items.ItemLog`, which every announced item passes through
(for ``previous_item_id`` and ``conversation.item.retrieve``).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import attrs

from realtime.openai import events as ev
from realtime.openai.items import ItemLog
from realtime.openai.turns import Committed, SpeechStarted, SpeechStopped, Transcribed, UserBeat
from realtime.wire_audio import WireFormat

Status = Literal["completed", "cancelled", "failed"]
"""How a response ends (``response.done``)."""


@attrs.frozen(slots=True)
class Part:
    """Where a content part stands: the fields every event about it carries."""

    response_id: str
    item_id: str
    output_index: int

    def fields(self) -> dict[str, Any]:
        return {
            "response_id": self.response_id,
            "item_id": self.item_id,
            "output_index": self.output_index,
            "content_index": 0,
        }


def response_created(
    response_id: str, modalities: list[str], metadata: Any, output_format: WireFormat
) -> ev.Event:
    body = ev.response(
        response_id,
        "in_progress",
        [],
        modalities=modalities,
        metadata=metadata,
        output_format=output_format,
    )
    return ev.event("response.created", response=body)


def response_done(
    response_id: str,
    status: Status,
    output: list[ev.Item],
    *,
    modalities: list[str],
    metadata: Any,
    reason: str | None,
    output_format: WireFormat,
    usage: dict[str, Any] | None = None,
) -> list[ev.Event]:
    """``response.done`` and the ``rate_limits.updated`` clients expect after it."""
    body = ev.response(
        response_id,
        status,
        copy.deepcopy(output),
        modalities=modalities,
        metadata=metadata,
        reason=reason,
        usage=usage,
        output_format=output_format,
    )
    return [
        ev.event("response.done", response=body),
        ev.event("rate_limits.updated", rate_limits=[]),
    ]


def _output_item(type_: str, response_id: str, output_index: int, item: ev.Item) -> ev.Event:
    return ev.event(
        type_, response_id=response_id, output_index=output_index, item=copy.deepcopy(item)
    )


def message_opened(part: Part, item: ev.Item, log: ItemLog, *, text: bool) -> list[ev.Event]:
    """An assistant message starts (``text``: as text, else as audio)."""
    content = {"type": "text", "text": ""} if text else {"type": "audio", "transcript": ""}
    return [
        _output_item("response.output_item.added", part.response_id, part.output_index, item),
        log.added(item),
        ev.event("response.content_part.added", part=content, **part.fields()),
    ]


def message_closed(
    part: Part, item: ev.Item, transcript: str, log: ItemLog, *, text: bool
) -> list[ev.Event]:
    """An assistant message ends as ``item``, having said ``transcript``."""
    fields = part.fields()
    if text:
        out = [ev.event("response.output_text.done", text=transcript, **fields)]
        content = {"type": "text", "text": transcript}
    else:
        out = [
            ev.event("response.output_audio.done", **fields),
            ev.event("response.output_audio_transcript.done", transcript=transcript, **fields),
        ]
        content = {"type": "audio", "transcript": transcript}
    return [
        *out,
        ev.event("response.content_part.done", part=content, **fields),
        _output_item("response.output_item.done", part.response_id, part.output_index, item),
        log.done(item),
    ]


def audio_delta(part: Part, audio: str) -> ev.Event:
    """``audio``: base64 of the session's output format (``session.audio.output.format``)."""
    return ev.event("response.output_audio.delta", delta=audio, **part.fields())


def text_delta(part: Part, spoken: str, *, text: bool) -> ev.Event:
    """What the model said: the text itself (``text``), else the audio's transcript."""
    kind = "response.output_text.delta" if text else "response.output_audio_transcript.delta"
    return ev.event(kind, delta=spoken, **part.fields())


def function_call(
    response_id: str, output_index: int, added: ev.Item, done: ev.Item, log: ItemLog
) -> list[ev.Event]:
    """One whole tool call, from its item's ``added`` to its ``done``: the model's
    calls are taken only once complete, so the arguments go out in one delta."""
    common = {
        "response_id": response_id,
        "item_id": done["id"],
        "output_index": output_index,
        "call_id": done["call_id"],
    }
    return [
        _output_item("response.output_item.added", response_id, output_index, added),
        log.added(added),
        ev.event("response.function_call_arguments.delta", delta=done["arguments"], **common),
        ev.event(
            "response.function_call_arguments.done",
            name=done["name"],
            arguments=done["arguments"],
            **common,
        ),
        _output_item("response.output_item.done", response_id, output_index, done),
        log.done(done),
    ]


def user_beat(beat: UserBeat, log: ItemLog) -> list[ev.Event]:
    """The events of one step of the user's turn."""
    match beat:
        case SpeechStarted(item_id, start):
            return [
                ev.event("input_audio_buffer.speech_started", item_id=item_id, audio_start_ms=start)
            ]
        case SpeechStopped(item_id, end):
            return [
                ev.event("input_audio_buffer.speech_stopped", item_id=item_id, audio_end_ms=end)
            ]
        case Committed(item_id):
            committed = ev.event("input_audio_buffer.committed", item_id=item_id)
            if log.last is not None:
                committed["previous_item_id"] = log.last
            return [committed, log.added(ev.user_message(item_id, None))]
        case Transcribed():
            return _transcribed(beat, log)


def _transcribed(beat: Transcribed, log: ItemLog) -> list[ev.Event]:
    fields = {"item_id": beat.item_id, "content_index": 0}
    out: list[ev.Event] = []
    if beat.transcript:
        out.append(
            ev.event(
                "conversation.item.input_audio_transcription.delta",
                delta=beat.transcript,
                **fields,
            )
        )
    out.append(
        ev.event(
            "conversation.item.input_audio_transcription.completed",
            transcript=beat.transcript,
            usage={"type": "duration", "seconds": round(beat.seconds, 3)},
            **fields,
        )
    )
    out.append(log.done(ev.user_message(beat.item_id, beat.transcript)))
    return out
