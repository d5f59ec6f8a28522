"""The ``/v1/realtime`` wire protocol, sans-IO.

Pure functions over attrs value types: parse a client frame into a message or
a :class:`ProtocolError`, and build server events as JSON-ready dicts. No
socket, no trio, no model here, so every rule is unit-testable on its own.
"""

from __future__ import annotations

import binascii
import json
import math
import secrets
import string
from json.encoder import encode_basestring  # what json.dumps(ensure_ascii=False) uses
from pathlib import PurePath
from typing import Any, Final

import attrs

from realtime import audio, jsonbounds
from realtime.audio import float_to_pcm16, pcm16_to_float
from realtime.endpoints import OPENAI_CLIENT_TYPES, OPENAI_DIALECT_HINT, OPENAI_SESSION_KEYS
from realtime.endpoints import ErrorCode as ErrorCode
from realtime.models.base import (
    VOICECHAT_FIGURES,
    AssistantTextDelta,
    AudioDelta,
    Cancelled,
    Done,
    FunctionDelta,
    ModelEvent,
    ModelFigures,
    Samples,
    UserTranscriptDelta,
)

MAX_SEED: Final = 2**63 - 1
MAX_STREAMING_SECONDS: Final = 86_400.0
"""The largest ``max_streaming_seconds`` accepted (a day); the smallest is one frame
(``figures.frame_seconds``)."""
SESSION_FIELDS: Final = ("model", "system_prompt", "seed", "max_streaming_seconds")

AUDIO_DELTA: Final = "response.audio.delta"

Event = dict[str, Any]


def new_event_id() -> str:
    return f"event_{secrets.token_hex(8)}"


def new_session_id() -> str:
    return f"sess_{secrets.token_hex(8)}"


class ProtocolError(Exception):
    """A client message that breaks the protocol; answered with ``invalid_request``."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# --- client messages ---------------------------------------------------------


@attrs.frozen(slots=True)
class SessionUpdate:
    model: str | None = None
    system_prompt: str | None = None
    seed: int = 0
    max_streaming_seconds: float | None = None


@attrs.frozen(slots=True, eq=False)
class AudioAppend:
    samples: Samples
    """float32 in [-1, 1): the PCM16 payload divided by 32768."""
    sample_rate: int = VOICECHAT_FIGURES.input_sample_rate
    """As the client stated it (the model's input rate when it did not)."""


@attrs.frozen(slots=True)
class AudioCommit:
    pad_partial: bool = True


@attrs.frozen(slots=True)
class Cancel:
    type: str = "session.cancel"


@attrs.frozen(slots=True)
class Ping:
    pass


ClientMessage = SessionUpdate | AudioAppend | AudioCommit | Cancel | Ping

CLIENT_TYPES: Final = (
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "session.cancel",
    "response.cancel",
    "session.ping",
)


def pcm16_from_base64(data: object) -> Samples:
    """Strict base64 of little-endian PCM16 mono to float32 ``/ 32768``."""
    try:
        return pcm16_to_float(audio.pcm16_from_base64(data))
    except ValueError as exc:
        raise ProtocolError(str(exc)) from None


def audio_to_base64(samples: Samples) -> str:
    """float samples to base64 little-endian PCM16 of ``round(clip(x, -1, 1) * 32767)``."""
    pcm = float_to_pcm16(samples).astype("<i2", copy=False)  # a no-op on little-endian hosts
    return binascii.b2a_base64(pcm.data, newline=False).decode("ascii")


def _field(obj: dict[str, Any], name: str, path: str) -> Any:
    return obj.get(name), f"{path}.{name}" if path else name


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_str(obj: dict[str, Any], name: str, path: str) -> str | None:
    value, where = _field(obj, name, path)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProtocolError(f"{where} must be a string or null")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(
            f"{where} is not valid Unicode text (it contains a lone surrogate)"
        ) from None
    return value


def _hinted(message: str, *, openai: bool) -> str:
    """``message``, naming the OpenAI dialect's endpoint when what it refuses is
    ``openai``-shaped; the rest of the refusal stays as it was."""
    return f"{message}; {OPENAI_DIALECT_HINT}" if openai else message


def _check_session_fields(session: dict[str, Any]) -> None:
    """Refuse any field ``session.update`` does not know, naming the accepted ones."""
    unknown = sorted(str(k) for k in session if k not in SESSION_FIELDS)
    if unknown:
        raise ProtocolError(
            _hinted(
                f"unknown session field{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(repr(k) for k in unknown)}; "
                f"accepted fields: {', '.join(SESSION_FIELDS)}",
                openai=any(k in OPENAI_SESSION_KEYS for k in unknown),
            )
        )


def _parse_seed(session: dict[str, Any]) -> int:
    """``session.seed``: an integer in [0, MAX_SEED], 0 when absent or null."""
    seed, where = _field(session, "seed", "session")
    if seed is None:
        return 0
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise ProtocolError(f"{where} must be an integer between 0 and {MAX_SEED}")
    checked: int = seed
    return checked


def _parse_max_streaming_seconds(session: dict[str, Any], figures: ModelFigures) -> float | None:
    """``session.max_streaming_seconds``: null (no bound) or one frame up to the cap."""
    mss, where = _field(session, "max_streaming_seconds", "session")
    if mss is None:
        return None
    if not isinstance(mss, (int, float)) or isinstance(mss, bool):
        raise ProtocolError(f"{where} must be a number > 0 or null")
    try:
        mss = float(mss)
    except OverflowError:
        mss = math.inf
    shortest = figures.frame_seconds
    if not shortest <= mss <= MAX_STREAMING_SECONDS:
        raise ProtocolError(
            f"{where} must lie between {shortest:g} (one frame) and "
            f"{MAX_STREAMING_SECONDS:g} seconds, or be null for no bound"
        )
    return mss


def _parse_session_update(msg: dict[str, Any], figures: ModelFigures) -> SessionUpdate:
    session = msg.get("session", {})
    if session is None:
        session = {}
    if not isinstance(session, dict):
        raise ProtocolError("session must be an object")
    _check_session_fields(session)
    model = _optional_str(session, "model", "session")
    system_prompt = _optional_str(session, "system_prompt", "session")
    seed = _parse_seed(session)
    mss = _parse_max_streaming_seconds(session, figures)
    return SessionUpdate(
        model=model, system_prompt=system_prompt, seed=seed, max_streaming_seconds=mss
    )


def _parse_append(msg: dict[str, Any], figures: ModelFigures) -> AudioAppend:
    if "audio" not in msg:
        raise ProtocolError("audio is required")
    rate = msg.get("sample_rate", figures.input_sample_rate)
    if not _is_int(rate) or rate <= 0:
        raise ProtocolError(f"sample_rate must be a positive integer ({figures.input_sample_rate})")
    return AudioAppend(samples=pcm16_from_base64(msg["audio"]), sample_rate=rate)


def _parse_commit(msg: dict[str, Any]) -> AudioCommit:
    pad = msg.get("pad_partial", True)
    if not isinstance(pad, bool):
        raise ProtocolError("pad_partial must be a boolean")
    return AudioCommit(pad_partial=pad)


def parse_client_message(
    frame: str | bytes, figures: ModelFigures = VOICECHAT_FIGURES
) -> ClientMessage:
    """Parse one WebSocket frame; raise :class:`ProtocolError` with a clear reason.

    Bounded like the OpenAI endpoint's events (:func:`realtime.jsonbounds.load`): more
    than ``MAX_JSON_VALUES`` values or ``MAX_JSON_DEPTH`` levels is refused from the
    text alone. The size bound (``max_message_bytes``) is the caller's.

    ``figures`` are the served model's: an append without ``sample_rate`` is at its
    input rate, and ``max_streaming_seconds`` is at least one of its frames.
    """
    if isinstance(frame, (bytes, bytearray)):
        raise ProtocolError("binary frames are not supported; send JSON text frames")
    try:
        # Refused by its structure (values, depth) before anything is built: a
        # hostile text costs a bounded scan of the event loop, not its parse.
        msg = jsonbounds.load(frame)
    except jsonbounds.Refused as exc:
        raise ProtocolError(f"message {exc}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("message must be a JSON object")
    kind = msg.get("type")
    if kind is None:
        raise ProtocolError("type is required")
    if not isinstance(kind, str):
        raise ProtocolError("type must be a string")
    if kind == "input_audio_buffer.append":
        return _parse_append(msg, figures)
    if kind == "session.ping":
        return Ping()
    if kind == "session.update":
        return _parse_session_update(msg, figures)
    if kind == "input_audio_buffer.commit":
        return _parse_commit(msg)
    if kind in ("session.cancel", "response.cancel"):
        return Cancel(type=kind)
    # Every GA type this endpoint shares was served above: what is left is OpenAI-only.
    raise ProtocolError(
        _hinted(
            f"unknown message type {kind!r}; expected one of {', '.join(CLIENT_TYPES)}",
            openai=kind in OPENAI_CLIENT_TYPES,
        )
    )


def model_matches(requested: str, model_id: str, path: str | None) -> bool:
    """``session.model`` may name the served model by id, path or the path's last part."""
    if requested in (model_id, path):
        return True
    last = PurePath(requested.rstrip("/\\")).name
    if last and last == model_id:
        return True
    return bool(path and last and last == PurePath(path.rstrip("/\\")).name)


# --- server events -------------------------------------------------------------


def _event(type_: str, **fields: Any) -> Event:
    return {"type": type_, "event_id": new_event_id(), **fields}


def _audio_format(sample_rate: int) -> dict[str, Any]:
    return {"type": "pcm16", "sample_rate": sample_rate}


def session_created(session_id: str, figures: ModelFigures = VOICECHAT_FIGURES) -> Event:
    """The greeting: the served model's input and output formats (``figures``)."""
    return _event(
        "session.created",
        session={
            "id": session_id,
            "state": "configuring",
            "input_audio_format": _audio_format(figures.input_sample_rate),
            "output_audio_format": _audio_format(figures.output_sample_rate),
        },
    )


def session_updated(
    session_id: str,
    model_id: str,
    update: SessionUpdate,
    figures: ModelFigures = VOICECHAT_FIGURES,
) -> Event:
    """The session is ready: the model's frame sizes and formats, so a client frames
    and checks audio by them rather than by VoiceChat's."""
    return _event(
        "session.updated",
        session={
            "id": session_id,
            "state": "ready",
            "model": model_id,
            "frame_samples": figures.frame_samples,
            "output_frame_samples": figures.output_frame_samples,
            "system_prompt": update.system_prompt,
            "seed": update.seed,
            "max_streaming_seconds": update.max_streaming_seconds,
            "input_audio_format": _audio_format(figures.input_sample_rate),
            "output_audio_format": _audio_format(figures.output_sample_rate),
        },
    )


def input_audio_committed() -> Event:
    return _event("input_audio_buffer.committed")


def pong() -> Event:
    return _event("session.pong")


def error_event(code: ErrorCode, message: str) -> Event:
    return _event("error", error={"code": code, "message": message})


def cancelled(frame_index: int) -> Event:
    return _event("response.cancelled", frame_index=frame_index)


_TOKEN_DELTA_TYPES: Final[dict[type[AssistantTextDelta] | type[FunctionDelta], str]] = {
    AssistantTextDelta: "response.text.delta",
    FunctionDelta: "response.function.delta",
}
"""The two token channels: the same fields on the wire, under their own event type."""


def wire_event(event: ModelEvent, figures: ModelFigures = VOICECHAT_FIGURES) -> Event:
    """Map one model event to its wire event (SPEC's model-event table); an audio
    frame must carry the model's ``figures.codebooks`` codes."""
    if isinstance(event, AudioDelta):
        codes = [int(c) for c in event.audio_codes]
        if len(codes) != figures.codebooks:
            raise ValueError(f"audio_codes has {len(codes)} codes, expected {figures.codebooks}")
        return _event(
            "response.audio.delta",
            frame_index=event.frame_index,
            delta=audio_to_base64(event.samples),
            format="pcm16",
            sample_rate=event.sample_rate,
            channels=1,
            audio_codes=codes,
        )
    if isinstance(event, AssistantTextDelta | FunctionDelta):
        return _event(
            _TOKEN_DELTA_TYPES[type(event)],
            frame_index=event.frame_index,
            token_id=event.token_id,
            delta=event.delta,
            text=event.text,
        )
    if isinstance(event, UserTranscriptDelta):
        return _event(
            "conversation.item.input_audio_transcription.delta",
            frame_index=event.frame_index,
            delta=event.delta,
            transcript=event.transcript,
        )
    if isinstance(event, Done):
        return _event("response.done", frame_index=event.frame_index)
    if isinstance(event, Cancelled):
        return cancelled(event.frame_index)
    raise TypeError(f"not a model event: {event!r}")


_AUDIO_DELTA_KEYS: Final = (
    "type",
    "event_id",
    "frame_index",
    "delta",
    "format",
    "sample_rate",
    "channels",
    "audio_codes",
)
_AUDIO_DELTA_HEAD: Final = '{"type":"response.audio.delta","event_id":'
_BASE64_ALPHABET: Final = (string.ascii_letters + string.digits + "+/=").encode("ascii")


def _audio_delta_text(event: Event) -> str | None:
    """The audio delta, the most frequent event (one per 80 ms frame), laid out
    directly: the very text ``json.dumps`` gives, without walking the dict and
    its 31-code list through the generic encoder. ``None`` when the event is not
    exactly the shape :func:`wire_event` builds (then the generic path runs)."""
    if tuple(event) != _AUDIO_DELTA_KEYS or event["type"] != AUDIO_DELTA:
        return None
    event_id, frame, delta = event["event_id"], event["frame_index"], event["delta"]
    rate, channels, codes = event["sample_rate"], event["channels"], event["audio_codes"]
    if not (
        type(event_id) is str
        and type(frame) is int
        and type(delta) is str
        and event["format"] == "pcm16"
        and type(rate) is int
        and type(channels) is int
        and type(codes) is list
        and all(type(c) is int for c in codes)
    ):
        return None
    # Base64 needs no escaping; checking that is a fifth of the cost of escaping.
    plain = delta.isascii() and not delta.encode("ascii").translate(None, _BASE64_ALPHABET)
    quoted = f'"{delta}"' if plain else encode_basestring(delta)
    return (
        f'{_AUDIO_DELTA_HEAD}{encode_basestring(event_id)},"frame_index":{frame},'
        f'"delta":{quoted},"format":"pcm16","sample_rate":{rate},'
        f'"channels":{channels},"audio_codes":[{",".join(map(str, codes))}]}}'
    )


def serialize(event: Event) -> str:
    """One server event as a compact JSON text frame."""
    if event.get("type") == AUDIO_DELTA:
        text = _audio_delta_text(event)
        if text is not None:
            return text
    return json.dumps(event, separators=(",", ":"), ensure_ascii=False)
