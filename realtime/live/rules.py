"""One ``/openai/v1/live/sessions`` connection as a pure state machine.

The Live API is full duplex: after ``session.start`` the model hears a frame and speaks
a frame every 80 ms whether the client talks or not (silence keeps its clock in real
time, as on the Realtime endpoint), starts and ends its own turns, and hands work to
the application as delegations. So there are no responses here: every frame's audio
goes out as it is made (``session.output_audio.delta``, silence included, as GPT-Live
sends it), its transcripts go out placed on the session's timeline, and a call of the
``delegate`` tool (:mod:`realtime.live.prompt`) becomes ``session.delegation.created``.
What the application appends (commentary, thinking, instructions) reaches the model on
its tool-result channel, stoppable, bounded and counted like a tool result.

Everything that affects the session's state lives in this file: client events and
model frames come in with the time, server events and work for the one session
pipeline (:mod:`realtime.session.work`) come out. No I/O, no clock.
:class:`LiveRules` is :class:`realtime.session.rules.Rules` with the capabilities
``CountsText``, ``FeedsTools`` and ``WatchesWrites``.
"""

from __future__ import annotations

import enum
import itertools
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar, Final

import attrs
import numpy as np

from realtime.limits import Limits, prompt_refusal
from realtime.live import events as ev
from realtime.live import messages as msg
from realtime.live.config import LiveConfig, parse_config, resource, updated_delegation
from realtime.live.prompt import system_prompt
from realtime.models.base import (
    DELEGATE_TOOL,
    ModelEvent,
    ModelFigures,
    PromptUse,
    RealtimeModel,
    context_feed,
)
from realtime.models.voicechat.tools import CallReader, Markers
from realtime.observe import SessionOutcome
from realtime.openai.clock import Deadlines, FrameClock
from realtime.openai.events import Invalid, new_id, serialize
from realtime.openai.turns import channels
from realtime.session.close_codes import CLOSE_INTERNAL, CLOSE_NORMAL, CLOSE_POLICY, Close
from realtime.session.rules import Output, Refusal
from realtime.session.work import (
    Backlog,
    CountTokens,
    Failure,
    FeedModel,
    LimitRefused,
    OpenModel,
    RunAudio,
    StopModel,
)
from realtime.wire_audio import AudioFormatError, InputFramer, OutputResampler

MAX_QUEUED_FEEDS: Final = 4
"""Appends that may wait to go into the model at once (as tool outputs do on the
Realtime endpoint); more are refused (``rate_limit_exceeded``), not queued."""
NOTICE_SECONDS: Final = 5.0
"""Audio refused for the same reason is told at most once this often: a client that
streams in real time is not sent an error per append."""
START_GRACE_SECONDS: Final = 1.0
"""The timeline starts with the client's first audio, or this long after
``session.started`` if none comes: a client whose microphone takes a moment to open
does not have silence put ahead of the user's first words."""
MAX_DELEGATIONS: Final = 1024
"""Delegation ids kept for the appends that name them (the oldest forgotten first)."""


class Phase(enum.Enum):
    AWAITING = "awaiting session.start"
    STARTING = "starting"
    """The prompt is counted, then the model opens: ``session.started`` comes after."""
    LIVE = "live"
    CLOSING = "closing"
    """``session.closed`` (or the closing error) is decided: only the close is owed."""
    DROPPED = "dropped"
    """The client stopped reading: the connection is aborted."""


class LiveRules:
    """One Live connection's state. One trio task at a time calls it."""

    audio_event: ClassVar[str] = "session.output_audio.delta"

    def __init__(
        self,
        session_id: str,
        model_id: str,
        limits: Limits,
        *,
        now: float,
        figures: ModelFigures,
        count_tokens: Callable[[str], int],
        created_at: float,
    ) -> None:
        self.session_id = session_id
        self.session_open = False
        self.backlog = Backlog(idle_from=now)
        self.phase = Phase.AWAITING
        self.limits = limits
        self.figures = figures
        self._model_id = model_id
        self._count_tokens = count_tokens
        self._expires_at = int(created_at + limits.live_max_seconds)
        self._configure_by = now + limits.configure_timeout
        self._deadlines = Deadlines(
            limits.send_timeout, limits.idle_timeout, last_message=now, last_sent=now
        )
        self._poll = min(1.0, limits.send_timeout / 4, limits.idle_timeout / 4)
        self._frames = FrameClock(figures.frame_seconds)
        self._frame_ms = figures.frame_seconds * 1000.0
        self._max_frames = max(1, math.floor(limits.live_max_seconds / figures.frame_seconds))
        self._max_backlog = max(1, int(limits.max_pending_audio_seconds / figures.frame_seconds))
        self._silence = np.zeros(figures.frame_samples, np.float32)
        self._tags = itertools.count()
        self.config: LiveConfig | None = None
        self._start_id: str | None = None
        self._prompt: str | None = None
        self._prompt_tokens = 0
        self._framer: InputFramer | None = None
        self._resampler: OutputResampler | None = None
        self.muted = False
        self._calls = CallReader(Markers.of(figures))
        self._delegations: deque[str] = deque(maxlen=MAX_DELEGATIONS)
        self._counting: msg.ContextAppend | None = None
        """An instructions append whose tokens are being counted."""
        self._feeding: deque[msg.ContextAppend] = deque()
        """Appends handed to the pipeline, in order, not yet in the model."""
        self._instruction_tokens = 0
        """Tokens of instructions appended so far (the prompt's are ``_prompt_tokens``)."""
        self._told: dict[str, float] = {}
        """When each rate-limited notice was last sent."""
        self._usage_second = 0
        self._clock_from = math.inf
        """When silence starts to keep the timeline in real time (the first audio starts
        it sooner)."""
        self.outcome: SessionOutcome = "client_gone"
        self.close_reason = ""

    @classmethod
    def new(cls, model: RealtimeModel, limits: Limits, now: float) -> LiveRules:
        return cls(
            new_id("sess"),
            model.model_id,
            limits,
            now=now,
            figures=model.figures,
            count_tokens=model.count_tokens,
            created_at=time.time(),
        )

    # --- wire ------------------------------------------------------------------------

    def created_event(self) -> None:
        """No greeting: the client speaks first (``session.start``)."""
        return None

    def refusal_event(self, code: Refusal, message: str) -> ev.Event:
        return ev.error(message, code=code, type_="server_error")

    def serialize(self, event: ev.Event) -> str:
        return serialize(event)  # the one compact JSON writer of the OpenAI dialects

    @property
    def closed(self) -> bool:
        return self.phase in (Phase.CLOSING, Phase.DROPPED)

    @property
    def timeline_ms(self) -> int:
        """Where the session's timeline stands: the end of the last frame the model ran."""
        return round(self._frames.done * self._frame_ms)

    # --- client messages ---------------------------------------------------------------

    def receive(self, frame: str | bytes | None, now: float) -> list[Output]:
        self._deadlines.last_message = now
        if self.closed:
            return []
        message = msg.parse_message(frame, max_bytes=self.limits.max_message_bytes)
        if isinstance(message, Invalid):
            return [ev.refused(message)]
        if isinstance(message, msg.Start):
            return self._start(message)
        if self.phase is Phase.AWAITING:
            return [_refusal(message, "session_not_started", "send session.start first")]
        return self._handle(message, now)

    def _handle(self, message: msg.ClientMessage, now: float) -> list[Output]:
        match message:
            case msg.AudioAppend():
                return self._append(message, now)
            case msg.ContextAppend():
                return self._context(message)
            case msg.Mute():
                return self._mute(message)
            case msg.Update():
                return self._update(message)
            case msg.Close():
                return self._close("close_requested", now, message.event_id)
            case msg.Unserved():
                return [
                    _refusal(
                        message,
                        "unsupported_feature",
                        f"{message.type} needs {msg.UNSERVED[message.type]}, which this "
                        "server has not (docs/openai-compatibility.md)",
                    )
                ]
            case msg.Start():
                return [_refusal(message, "session_already_started", "the session has started")]
        return []  # pragma: no cover - every message is matched above

    def _start(self, message: msg.Start) -> list[Output]:
        if self.phase is not Phase.AWAITING:
            return [_refusal(message, "session_already_started", "session.start was sent")]
        config = parse_config(message.session)
        if isinstance(config, Invalid):
            return [ev.refused(_with_id(config, message.event_id))]
        self.phase = Phase.STARTING
        self.config = config
        self._start_id = message.event_id
        self._prompt = system_prompt(config)
        if self._prompt is None:
            return self._open()
        return [CountTokens(self._prompt, self._count_tokens)]

    def counted(self, text: str, tokens: int | Exception, now: float) -> list[Output]:
        """The tokenizer counted ``text`` off the event loop: the session's prompt (it
        opens, or the start is refused) or an instructions append."""
        if self.closed:
            return []
        if self._counting is not None:
            message, self._counting = self._counting, None
            return self._instructions_counted(message, tokens)
        if self.phase is not Phase.STARTING or text != self._prompt:
            return []

        def count(_: str) -> int:
            if isinstance(tokens, Exception):
                raise tokens
            return tokens

        refusal = prompt_refusal(
            text,
            self.limits.max_system_prompt_tokens,
            count,
            field="the instructions with the startup input and the delegate tool",
        )
        if refusal is not None:
            self.phase, self.config, self._prompt = Phase.AWAITING, None, None
            return [
                ev.error(
                    f"{refusal}; the session did not start",
                    code="invalid_value",
                    param="session.instructions",
                    client_event_id=self._start_id,
                )
            ]
        self._prompt_tokens = tokens if isinstance(tokens, int) else 0
        return self._open()

    def _open(self) -> list[Output]:
        assert self.config is not None
        rate = self.config.format.rate
        self._framer = InputFramer(rate, figures=self.figures)
        self._resampler = OutputResampler(rate)
        return [OpenModel(self._prompt)]

    def _append(self, message: msg.AudioAppend, now: float) -> list[Output]:
        if self.phase is not Phase.LIVE or self._framer is None or self.config is None:
            return self._notice(
                message,
                now,
                "session_not_started",
                "audio before session.started is not heard: wait for session.started",
            )
        fmt = self.config.format
        seconds = fmt.seconds(len(message.audio) * 3 // 4)
        if seconds > self.limits.max_pending_audio_seconds:
            return [
                _refusal(
                    message,
                    "invalid_value",
                    f"the append holds {seconds:.1f} s of audio; at most "
                    f"{self.limits.max_pending_audio_seconds:g} s an append "
                    "(--max-pending-audio-seconds): send audio as it is captured",
                    param="audio",
                )
            ]
        if self._frames.backlog >= self._max_backlog:
            return self._notice(
                message,
                now,
                "input_audio_buffer_full",
                f"{self._frames.backlog * self.figures.frame_seconds:.2f} s of audio wait for "
                "the model; send audio no faster than real time (later appends refused "
                f"for the same reason are dropped without an error for {NOTICE_SECONDS:g} s)",
            )
        try:
            samples = fmt.decode(message.audio)
        except AudioFormatError as exc:
            return [_refusal(message, "invalid_value", str(exc), param="audio")]
        if self._frames.start is None:
            self._frames.start = now
        return [self._frame(frame, now) for frame in self._framer.push(samples)]

    def _notice(self, message: msg.ClientMessage, now: float, code: str, text: str) -> list[Output]:
        """Refused audio: an error at most every :data:`NOTICE_SECONDS` per reason; the
        rest dropped and counted."""
        told = self._told.get(code)
        if told is not None and now - told < NOTICE_SECONDS:
            return [LimitRefused("live_audio_dropped")]
        self._told[code] = now
        return [LimitRefused("live_audio_dropped"), _refusal(message, code, text)]

    def _frame(self, samples: np.ndarray[Any, Any], now: float) -> RunAudio:
        self._frames.submitted += 1
        heard = self._silence if self.muted else samples
        return RunAudio(next(self._tags), heard, self.figures.input_sample_rate, now)

    def _mute(self, message: msg.Mute) -> list[Output]:
        self.muted = message.muted
        kind = "session.input_audio.muted" if message.muted else "session.input_audio.unmuted"
        return [ev.event(kind, client_event_id=message.event_id)]

    def _update(self, message: msg.Update) -> list[Output]:
        assert self.config is not None
        delegation = updated_delegation(self.config.delegation, message.session)
        if isinstance(delegation, Invalid):
            return [ev.refused(_with_id(delegation, message.event_id))]
        self.config = _evolve_delegation(self.config, delegation)
        return [
            ev.event("session.updated", client_event_id=message.event_id, session=self._resource())
        ]

    def _context(self, message: msg.ContextAppend) -> list[Output]:
        if self.phase is not Phase.LIVE:
            return [_refusal(message, "session_not_started", "wait for session.started")]
        if message.delegation_id is not None and message.delegation_id not in self._delegations:
            return [
                _refusal(
                    message,
                    "invalid_value",
                    f"no delegation {message.delegation_id!r} in this session",
                    param="delegation_id",
                )
            ]
        if len(self._feeding) + (self._counting is not None) >= MAX_QUEUED_FEEDS:
            return [
                _refusal(
                    message,
                    "rate_limit_exceeded",
                    f"{len(self._feeding)} appends are still going into the model; at most "
                    f"{MAX_QUEUED_FEEDS} may wait: send the next once one is acknowledged",
                    param="content",
                )
            ]
        if message.kind == "instructions":
            self._counting = message
            return [CountTokens(message.content, self._count_tokens)]
        return self._feed(message)

    def _instructions_counted(
        self, message: msg.ContextAppend, tokens: int | Exception
    ) -> list[Output]:
        limit = self.limits.max_system_prompt_tokens
        if isinstance(tokens, Exception):
            why = f"the instructions cannot be tokenized: {type(tokens).__name__}: {tokens}"
            return [_refusal(message, "invalid_value", why, param="content")]
        total = self._prompt_tokens + self._instruction_tokens + tokens
        if total > limit:
            return [
                _refusal(
                    message,
                    "invalid_value",
                    f"the instructions would come to {total} tokens with this append, over "
                    f"the {limit}-token limit (--max-system-prompt-tokens); not appended",
                    param="content",
                )
            ]
        self._instruction_tokens += tokens
        return self._feed(message)

    def _feed(self, message: msg.ContextAppend) -> list[Output]:
        self._feeding.append(message)
        return [FeedModel(context_feed(message.kind, message.content))]

    def fed(self, failure: Failure | None, now: float, tokens: int) -> list[Output]:
        """An append went into the model (or why it could not)."""
        if not self._feeding or self.closed:
            return []
        message = self._feeding.popleft()
        if failure is not None and failure.lost:
            return self._failed(failure, now)
        if failure is not None:
            if message.kind == "instructions":
                self._instruction_tokens = max(0, self._instruction_tokens - tokens)
            return [
                _refusal(
                    message,
                    "invalid_value",
                    f"the {message.kind} did not reach the model: {failure.message}",
                    param="content",
                )
            ]
        at = self.timeline_ms
        return [
            ev.span(f"session.{message.kind}.appended", at, at, client_event_id=message.event_id)
        ]

    # --- the model's side ------------------------------------------------------------------

    def opened(
        self, failure: Failure | None, now: float, *, prompt: PromptUse | None = None
    ) -> list[Output]:
        if self.closed:  # closed while the model opened: nothing more is owed
            self.session_open = failure is None
            return []
        if failure is not None:
            self._end(now, "error", failure.message)
            return [
                ev.error(
                    f"the model session could not be opened: {failure.message}",
                    code="session_initialization_failed",
                    type_="server_error",
                    client_event_id=self._start_id,
                ),
                Close(CLOSE_INTERNAL, failure.message[:120]),
            ]
        self.session_open = True
        self.phase = Phase.LIVE
        self._clock_from = now + START_GRACE_SECONDS
        self._deadlines.last_message = max(self._deadlines.last_message, now)
        return [
            ev.event("session.started", client_event_id=self._start_id, session=self._resource())
        ]

    def begin_audio(self, work: RunAudio) -> list[Output] | None:
        if self.session_open:
            return None
        self._frames.done += 1  # not run: the model is not open
        return []

    def keep_submitting(self, tag: int) -> bool:
        return not self.closed

    def slice_done(self, tag: int, events: list[ModelEvent] | None, now: float) -> list[Output]:
        if events is None:
            self._frames.done += 1
            return self._expiry(now)
        return self._frame_done(events, now)

    def slice_failed(self, tag: int, failure: Failure, now: float) -> list[Output]:
        self._frames.done += 1
        if failure.lost:
            return self._failed(failure, now)
        return [
            ev.error(
                f"the model failed: {failure.message}", code="inference_error", type_="server_error"
            )
        ]

    def _failed(self, failure: Failure, now: float) -> list[Output]:
        if self.closed:
            return []
        self._end(now, "error", failure.message)
        return [
            ev.error(
                f"the model failed: {failure.message}", code="inference_error", type_="server_error"
            ),
            Close(CLOSE_INTERNAL, failure.message[:120]),
        ]

    def _frame_done(self, events: list[ModelEvent], now: float) -> list[Output]:
        index = self._frames.done
        self._frames.done += 1
        if self.closed:
            return []
        start, end = round(index * self._frame_ms), round((index + 1) * self._frame_ms)
        frame = channels(events, index)
        out: list[Output] = []
        if frame.heard:
            out.append(ev.span("session.input_transcript.delta", start, end, delta=frame.heard))
        if frame.spoken:
            out.append(ev.span("session.output_transcript.delta", start, end, delta=frame.spoken))
        for delta in frame.functions:
            for name, _arguments in self._calls.push(delta):
                if name == DELEGATE_TOOL:
                    out.append(self._delegate(end))
        if frame.audio is not None and self._resampler is not None and self.config is not None:
            audio = self._resampler.push(frame.audio.samples, frame.audio.sample_rate)
            if audio.shape[0]:
                out.append(ev.audio_delta(self.config.format.encode(audio)))
        second = int(self._frames.done * self.figures.frame_seconds)
        if second > self._usage_second:
            self._usage_second = second
            out.append(self._usage())
        return out + self._expiry(now)

    def _delegate(self, offset_ms: int) -> ev.Event:
        delegation_id = new_id("deleg")
        self._delegations.append(delegation_id)
        return ev.event(
            "session.delegation.created",
            delegation={"id": delegation_id, "target": "client", "type": "delegation"},
            offset_ms=offset_ms,
        )

    def _usage(self) -> ev.Event:
        return ev.event("session.usage.updated", **ev.usage(self._seconds(), None))

    def _seconds(self) -> float:
        return self._frames.done * self.figures.frame_seconds

    def _expiry(self, now: float) -> list[Output]:
        """The timeline reached ``--live-max-seconds``: closed with ``expired`` once the
        last frame is back."""
        if (
            self.phase is Phase.LIVE
            and self._frames.submitted >= self._max_frames
            and self._frames.done >= self._frames.submitted
        ):
            return self._close("expired", now, None)
        return []

    # --- closing ---------------------------------------------------------------------------

    def _close(self, reason: str, now: float, client_event_id: str | None) -> list[Output]:
        """``session.closed`` with ``reason``, after the final usage; queued frames are
        dropped, nothing more is owed."""
        self._end(now, "done" if reason == "close_requested" else "timeout", reason)
        closed = ev.event(
            "session.closed",
            client_event_id=client_event_id,
            reason=reason,
            session=self._resource(),
            **ev.usage(self._seconds(), None),
        )
        return [StopModel(), self._usage(), closed, Close(CLOSE_NORMAL, f"session {reason}")]

    def _end(self, now: float, outcome: SessionOutcome, reason: str) -> None:
        if self.phase is not Phase.DROPPED:
            self.phase = Phase.CLOSING
        self._deadlines.closing_since = now
        if not self.close_reason:
            self.outcome, self.close_reason = outcome, reason

    def _resource(self) -> dict[str, Any]:
        assert self.config is not None
        return resource(
            self.config,
            session_id=self.session_id,
            model=self._model_id,
            expires_at=self._expires_at,
        )

    def connection_lost(self, outcome: SessionOutcome, reason: str) -> None:
        if not self.close_reason:
            self.outcome, self.close_reason = outcome, reason

    def ending(self) -> tuple[SessionOutcome, str]:
        return self.outcome, self.close_reason

    # --- time --------------------------------------------------------------------------------

    def sending(self, now: float) -> None:
        self._deadlines.sending(now)

    def sent(self, now: float) -> None:
        self._deadlines.sent(now)

    def check_timeouts(self, now: float) -> list[Output]:
        """The stalled-reader, start and idle deadlines; silence to keep the model's
        clock in real time while the client is quiet."""
        stall = None if self.phase is Phase.DROPPED else self._deadlines.stall()
        if stall is not None and now >= stall:
            self._end(now, "stalled_client", "client stopped reading")
            self.phase = Phase.DROPPED
            return [Close(CLOSE_POLICY, "client stopped reading", now=True)]
        if self.closed:
            return []
        if self.phase is Phase.AWAITING and now >= self._configure_by:
            message = f"no session.start within {self.limits.configure_timeout:g} s; closing"
            self._end(now, "timeout", message)
            return [ev.error(message, code="session_start_timeout"), Close(CLOSE_POLICY, message)]
        # The client waits for session.started while the prompt is read: not idle.
        if self.phase is not Phase.STARTING and self._deadlines.idle_passed(now):
            message = f"no client event for {self.limits.idle_timeout:g} s; closing"
            self._end(now, "timeout", message)
            return [ev.error(message, code="idle_timeout"), Close(CLOSE_POLICY, message)]
        if self.phase is not Phase.LIVE:
            return []
        if self._frames.start is None and now >= self._clock_from:
            self._frames.start = self._clock_from
        due = min(self._frames.silence_due(now), self._max_frames - self._frames.submitted)
        return [self._frame(self._silence, now) for _ in range(max(0, due))]

    def next_check(self, now: float) -> float:
        at = self._deadlines.next_check(
            now,
            self._poll,
            closed=self.closed,
            dropped=self.phase is Phase.DROPPED,
            idle=self.phase is not Phase.STARTING,
        )
        if self.phase is Phase.AWAITING:
            at = min(at, self._configure_by)
        if self.phase is Phase.LIVE and self._frames.start is None:
            at = min(at, max(self._clock_from, now))
        elif self.phase is Phase.LIVE:
            at = min(at, self._frames.next_frame(now))
        return at


def _refusal(
    message: msg.ClientMessage, code: str, text: str, *, param: str | None = None
) -> ev.Event:
    return ev.error(text, code=code, param=param, client_event_id=message.event_id)


def _with_id(invalid: Invalid, event_id: str | None) -> Invalid:
    return Invalid(invalid.code, invalid.message, invalid.param, event_id)


def _evolve_delegation(config: LiveConfig, delegation: dict[str, Any] | None) -> LiveConfig:
    return attrs.evolve(config, delegation=delegation)
