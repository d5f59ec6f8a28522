"""The OpenAI Realtime (GA) dialect of one connection, as a pure state machine.

A full-duplex model has no turns: every 80 ms it hears a frame and speaks a
frame. OpenAI clients think in responses. The dialect maps one onto the other:
typed client messages (:mod:`.messages`) and model frames come in, are routed to
one handler each, and server events and work for the plumbing come out as lists.
The rules it routes to live beside it, one concern a module:

* :mod:`.session`: what ``session.update`` may change, the system prompt, and
  who opens a response (``server_responds``) and whether speech cuts it
  (``interrupts``), by ``turn_detection``;
* :mod:`.turns`: where model and user turns begin and end, from the channels
  (and the held turn, which no response carries yet);
* :mod:`.responses` and :mod:`.render`: the active response and its events;
* :mod:`.items`: the conversation's items, within bounds;
* :mod:`realtime.models.voicechat.tools`: tools in the prompt, tool calls from the
  function channel (VoiceChat's tool format);
* :mod:`.clock`: silence pacing and the idle and stalled-reader deadlines;
* :mod:`.states`: every state and its legal transitions, in one table.

Like :mod:`realtime.native.rules`, nothing here does I/O or reads a clock: the
time comes in with each call. :mod:`realtime.openai.connection` carries the rest.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Final, assert_never

import attrs
import numpy as np

from realtime.limits import Limits
from realtime.models.base import (
    VOICECHAT_FIGURES,
    AssistantTextDelta,
    ModelEvent,
    ModelFigures,
    Samples,
    tool_output_refusal,
)
from realtime.models.voicechat.tools import CallReader, Markers
from realtime.observe import DropReason
from realtime.openai import events as ev
from realtime.openai import messages as msg
from realtime.openai import render
from realtime.openai import session as sess
from realtime.openai.clock import Deadlines, FrameClock
from realtime.openai.items import (
    MAX_ITEM_BYTES,
    VALUE_BYTES,
    ItemLog,
    ItemStore,
    client_item,
    item_bytes,
)
from realtime.openai.responses import FrameOutput, Responses
from realtime.openai.states import ModelState, Phase, Trigger, advance
from realtime.openai.turns import Channels, SpeechStarted, Turns, TurnStep, UserBeat, channels
from realtime.openai.usage import Context
from realtime.session.close_codes import CLOSE_INTERNAL, CLOSE_POLICY, Close
from realtime.session.work import CountTokens, DroppedAudio, FeedModel, OpenModel, RunAudio
from realtime.wire_audio import PCM24, InputFramer, OutputResampler

MAX_QUEUED_FEEDS: Final = 4
"""Tool outputs that may wait to go into the model at once; each is at most
:data:`~realtime.models.base.MAX_TOOL_OUTPUT_BYTES`, so one connection's queued feeds
hold at most 4 x 16 KiB. More are refused (``rate_limit_exceeded``), not queued."""

COUNT_BURST: Final = 4
"""Updates with a new system prompt (instructions or tools) counted at once; after that
one a second (each is tokenized, which for a long prompt costs the event loop a
noticeable pause: docs/reliability.md)."""

FULL_ERROR_SECONDS: Final = 10.0
"""At most one ``input_audio_buffer_full`` error this often: a client that sends audio
faster than real time hears why, not once per append (what it sends meanwhile over
the bound is dropped and counted)."""


@attrs.define(slots=True)
class Budget:
    """A token bucket: ``size`` at most, ``rate`` a second come back."""

    size: float
    rate: float
    left: float
    at: float

    def take(self, now: float) -> bool:
        """Take one if one is left (else take nothing)."""
        self._refill(now)
        if self.left < 1.0:
            return False
        self.left -= 1.0
        return True

    def spend(self, now: float, amount: float) -> bool:
        """Take ``amount`` whatever is left (it may go below zero); whether it was there."""
        self._refill(now)
        self.left -= amount
        return self.left >= 0.0

    def _refill(self, now: float) -> None:
        self.left = min(self.size, self.left + max(0.0, now - self.at) * self.rate)
        self.at = max(self.at, now)


# --- outputs ---------------------------------------------------------------------------


Output = ev.Event | OpenModel | RunAudio | FeedModel | Close | CountTokens | DroppedAudio
"""What the rules hand on: server events, the session's work values for the model
pipeline (:mod:`realtime.session.work`), and the close."""


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
        figures: ModelFigures = VOICECHAT_FIGURES,
    ) -> None:
        self.session_id = session_id
        self.figures = figures
        self._silence = np.zeros(figures.frame_samples, np.float32)
        """One frame of silence, fed while the client is quiet."""
        self.limits = limits
        self.session = ev.default_session(session_id, model_id)
        self._count_tokens = count_tokens
        """The model's tokenizer: the system prompt's length is checked before it opens."""
        self._new_id = new_id
        self.phase = Phase.SERVING
        self.model_state = ModelState.CLOSED
        self._applied: sess.Session | None = None
        """Instructions and tools as prefilled (``None``: the model is not opening)."""
        self._frames = FrameClock(figures.frame_seconds)
        self._max_backlog = max(1, int(limits.max_pending_audio_seconds / figures.frame_seconds))
        self._deadlines = Deadlines(
            limits.send_timeout, limits.idle_timeout, last_message=now, last_sent=now
        )
        self.input_format = PCM24
        """``session.audio.input.format``: how appended audio is decoded."""
        self.output_format = PCM24
        """``session.audio.output.format``: what the model's audio is resampled to."""
        self._framer = InputFramer(self.input_format.rate, figures)
        self._held: deque[Samples] = deque()
        """Frames heard while the model opens (a long prompt's prefill can take a
        minute), not handed on yet: the newest, with the queued ones, up to the bound."""
        self._pace = Budget(
            limits.max_pending_audio_seconds, 1.0, limits.max_pending_audio_seconds, now
        )
        """The client's audio against real time (seconds of it a second): once it runs
        dry the client sends faster than real time, by more than the backlog bound."""
        self._full_error_at = -math.inf
        """When the last ``input_audio_buffer_full`` error went out."""
        self._drop_noted: set[DropReason] = set()
        """Why audio was dropped so far (each reason's first drop is logged)."""
        self._poll = min(1.0, limits.send_timeout / 4, limits.idle_timeout / 4)
        """How often the clock re-reads its deadlines (as the native rules do)."""
        self._appended = False
        """Audio came since the last commit or clear."""
        self._resampler = OutputResampler(self.output_format.rate)
        self._calls = CallReader(Markers.of(figures))
        self._log = ItemLog()
        self._turns = Turns(new_id, figures.frame_seconds)
        self._responses = Responses(new_id, self._log)
        self._feeds_queued = 0
        """Tool outputs handed to the pipeline and not yet fed (``fed``)."""
        self._counts: dict[str, int | Exception] = {}
        """The latest system prompt the tokenizer counted (or why it could not)."""
        self._pending_update: msg.SessionUpdate | None = None
        """The update waiting for its prompt's count."""
        self._count_budget = Budget(COUNT_BURST, 1.0, COUNT_BURST, now)
        self.usage = Context()
        """The model's context so far, as every ``response.done``'s ``usage`` counts it."""
        self._responses = Responses(new_id, self._log, self.usage)
        self._prompt_tokens = 0
        """The system prompt's tokens, counted in ``usage`` once the model has opened."""
        self._function_tokens = 0
        """Function-channel tokens since the last complete tool call."""

    @property
    def closed(self) -> bool:
        """The close is decided: nothing but it is owed the client."""
        return self.phase is not Phase.SERVING

    @property
    def items(self) -> ItemStore:
        return self._log.store

    @property
    def _modalities(self) -> list[str]:
        return sess.modalities(self.session)

    # --- client messages -------------------------------------------------------------------

    def receive(self, frame: str | bytes | None, now: float) -> list[Output]:
        self._deadlines.last_message = now
        if self.closed:
            return []
        message = msg.parse_message(
            frame, max_bytes=self.limits.max_message_bytes, input_format=self.input_format
        )
        if isinstance(message, ev.Invalid):
            return [ev.refused(message)]
        return self._handle(message)

    def _handle(self, message: msg.ClientMessage) -> list[Output]:
        """Each client message to its handler, by its type."""
        match message:
            case msg.SessionUpdate():
                return self._update(message)
            case msg.AudioAppend():
                return self._append(message)
            case msg.AudioCommit():
                return self._commit(message)
            case msg.AudioClear():
                return self._clear()
            case msg.OutputAudioClear():
                return self._clear_output()
            case msg.ItemCreate():
                return self._create_item(message)
            case msg.ItemRetrieve():
                return self._retrieve_item(message)
            case msg.ItemTruncate():
                return self._truncate_item(message)
            case msg.ItemDelete():
                return self._delete_item(message)
            case msg.ResponseCreate():
                return self._create_response(message)
            case msg.ResponseCancel():
                return self._cancel_response(message)
            case _:
                assert_never(message)

    def _update(self, message: msg.SessionUpdate) -> list[Output]:
        uncounted: list[str] = []

        def known(text: str) -> int:
            tokens = self._counts.get(text)
            if tokens is None:
                uncounted.append(text)
                return 0
            if isinstance(tokens, Exception):
                raise tokens
            return tokens

        merged = sess.updated(
            self.session,
            message.session,
            applied=self._applied,
            max_prompt_tokens=self.limits.max_system_prompt_tokens,
            count_tokens=known,
        )
        if uncounted:
            return self._count(message, uncounted[0])
        if isinstance(merged, ev.Invalid):
            return [ev.refused(attrs.evolve(merged, event_id=message.event_id))]
        self.session = merged
        self._formats_changed()
        return [ev.session_event("session.updated", self.session)]

    def _formats_changed(self) -> None:
        """Follow the session's audio formats. A new input rate gets a new framer (the
        partial frame, under one model frame, is dropped; whole frames already went to
        the model); a new output rate a new resampler (its filter's tail, a few ms, is
        dropped). A new encoding at the same rate changes only how later audio is read
        or written: the streams go on. Appends decoded before the update stay as
        they were read."""
        new_in = sess.audio_format(self.session, "input")
        if new_in.rate != self.input_format.rate:
            self._framer = InputFramer(new_in.rate, self.figures)
        self.input_format = new_in
        new_out = sess.audio_format(self.session, "output")
        if new_out.rate != self.output_format.rate:
            self._resampler = OutputResampler(new_out.rate)
        self.output_format = self._responses.output_format = new_out

    def _count(self, message: msg.SessionUpdate, text: str) -> list[Output]:
        """Have the pipeline count ``text`` off the event loop (:meth:`counted` applies
        ``message`` then); at most ``COUNT_BURST`` prompts at once, then one a second."""
        now = self._deadlines.last_message
        if not self._count_budget.take(now):
            return _refusal(
                message,
                "rate_limit_exceeded",
                f"more than {COUNT_BURST} updates with new instructions or tools came "
                f"within {COUNT_BURST:g} s; each is tokenized: this one was not applied",
                param="session.instructions",
            )
        self._pending_update = message
        return [CountTokens(text, self._count_tokens)]

    def counted(self, text: str, tokens: int | Exception, now: float) -> list[Output]:
        """The pipeline counted ``text`` (:class:`~realtime.session.work.CountTokens`): the
        update that asked for it is applied or refused now."""
        message, self._pending_update = self._pending_update, None
        if message is None:
            return []
        self._counts = {text: tokens}  # only the latest prompt is kept
        return self._update(message)

    def _append(self, message: msg.AudioAppend) -> list[Output]:
        now = self._deadlines.last_message
        samples = message.samples
        seconds = samples.shape[0] / self.input_format.rate
        limit = self.limits.max_pending_audio_seconds
        if seconds > limit:
            # Bounded in seconds, not bytes: a message of G.711 holds 6 times the
            # audio of one of 24 kHz PCM16.
            return _refusal(
                message,
                "input_audio_buffer_full",
                f"this append of {seconds:.2f} s is larger than the {limit:g} s limit on "
                "pending input audio; send it in smaller appends, no faster than real time",
            )
        in_time = self._pace.spend(now, seconds)
        if self.model_state is ModelState.OPEN and self._frames.backlog >= self._max_backlog:
            return self._full(message, seconds, in_time=in_time, now=now)
        out = self._ensure_open()
        if samples.shape[0]:
            self._appended = True
        frames = self._framer.push(samples)
        if self.model_state is ModelState.OPEN:
            return out + [self._frame(frame, now) for frame in frames]
        dropped = 0
        for frame in frames:
            # The model is opening: the newest audio is kept, up to the bound (the
            # frames already handed on, by a response or a tool output, count too).
            if self._frames.backlog + len(self._held) >= self._max_backlog:
                dropped += 1
                if not self._held:
                    continue  # nothing held to make room: this one goes
                self._held.popleft()
            self._held.append(frame)
        if dropped:
            out.append(self._dropped(dropped * self.figures.frame_seconds, "opening"))
        return out

    def _full(
        self, message: msg.AudioAppend, seconds: float, *, in_time: bool, now: float
    ) -> list[Output]:
        """An append over the bound while the model runs: dropped. Only a client that
        sends faster than real time is told (at most once in ``FULL_ERROR_SECONDS``); one
        that paces in real time, with the engine behind it, is not at fault."""
        out: list[Output] = [self._dropped(seconds, "engine_behind" if in_time else "too_fast")]
        if in_time or now < self._full_error_at + FULL_ERROR_SECONDS:
            return out
        self._full_error_at = now
        backlog = self._frames.backlog * self.figures.frame_seconds
        return out + _refusal(
            message,
            "input_audio_buffer_full",
            f"input audio backlog is full ({backlog:.2f} s waiting for the model); send "
            f"audio no faster than real time (audio over the bound is dropped; this "
            f"error comes at most once in {FULL_ERROR_SECONDS:g} s)",
        )

    def _dropped(self, seconds: float, reason: DropReason) -> DroppedAudio:
        """``seconds`` of input audio dropped; the session's first drop for ``reason``
        carries its log line."""
        if reason in self._drop_noted:
            return DroppedAudio(seconds, reason)
        self._drop_noted.add(reason)
        bound = f"{self.limits.max_pending_audio_seconds:g} s (max_pending_audio_seconds)"
        notes: dict[DropReason, str] = {
            "opening": f"the model is still opening (reading its system prompt): of the "
            f"audio sent meanwhile the newest {bound} is kept, the oldest dropped",
            "engine_behind": f"the engine is behind the client's real-time audio: appends "
            f"over {bound} of backlog are dropped",
            "too_fast": f"the client sends audio faster than real time: appends over "
            f"{bound} of backlog are refused (input_audio_buffer_full, at most one "
            f"error in {FULL_ERROR_SECONDS:g} s)",
        }
        return DroppedAudio(seconds, reason, notes[reason] + "; counted in /metrics")

    def _release(self, now: float) -> list[Output]:
        """The frames held while the model opened, handed on in order: once it has
        opened, or before work that must follow them (a response, a tool output)."""
        out: list[Output] = [self._frame(frame, now) for frame in self._held]
        self._held.clear()
        return out

    def _commit(self, message: msg.AudioCommit) -> list[Output]:
        if not self._appended and not self._turns.user_pending:
            return _refusal(
                message,
                "input_audio_buffer_commit_empty",
                "the input audio buffer is empty: append audio before committing",
            )
        self._appended = False
        beats = self._turns.commit(vad=sess.vad(self.session), frame_index=self._frames.done)
        return self._user_events(beats)

    def _clear(self) -> list[Output]:
        self._framer.drop_partial()
        self._appended = False
        self._turns.forget_user()
        return [ev.event("input_audio_buffer.cleared")]

    def _clear_output(self) -> list[Output]:
        # The server keeps no output buffer (audio goes out as it is made): cutting
        # the current response is response.cancel's job. Acknowledged, not refused.
        active = self._responses.active
        rid = active.id if active is not None else "resp_none"
        return [ev.event("output_audio_buffer.cleared", response_id=rid)]

    def _create_item(self, message: msg.ItemCreate) -> list[Output]:
        stored = client_item(message.item, self._new_id("item"))
        size = item_bytes(stored)
        if size > MAX_ITEM_BYTES:
            return _refusal(
                message,
                "invalid_value",
                f"the item weighs {size} bytes (its JSON, plus {VALUE_BYTES} per value), "
                f"over the {MAX_ITEM_BYTES}-byte limit for one item; it was not added",
                param="item",
            )
        feed = stored["type"] == "function_call_output"
        output = str(stored.get("output", "")) if feed else ""
        if feed:
            refused = self._feed_refusal(message, output)
            if refused:
                return refused
        out: list[Output] = [self._log.added(stored, size=size), self._log.done(stored)]
        if feed:
            # The model takes a tool's result on its function channel (as trained); a
            # text message is kept in the conversation but does not reach it.
            out += self._ensure_open()
            out += self._release(self._deadlines.last_message)
            self._feeds_queued += 1
            out.append(FeedModel(output))
        return out

    def _feed_refusal(self, message: msg.ItemCreate, output: str) -> list[Output]:
        """A tool output refused before it is stored or queued: too big to reach the
        model (bytes, before any tokenizing), or too many already waiting for it."""
        too_big = tool_output_refusal(output)
        if too_big is not None:
            return _refusal(message, "invalid_value", too_big, param="item.output")
        if self._feeds_queued >= MAX_QUEUED_FEEDS:
            return _refusal(
                message,
                "rate_limit_exceeded",
                f"{self._feeds_queued} tool outputs are still going into the model; at "
                f"most {MAX_QUEUED_FEEDS} may wait: send the next once one is in",
                param="item.output",
            )
        return []

    def _retrieve_item(self, message: msg.ItemRetrieve) -> list[Output]:
        item = self.items.get(message.item_id)
        if item is None:
            return _refusal(
                message,
                "item_not_found",
                f"no item {message.asked} in this conversation",
                param="item_id",
            )
        return [ev.event("conversation.item.retrieved", item=copy.deepcopy(item))]

    def _truncate_item(self, message: msg.ItemTruncate) -> list[Output]:
        # The model keeps what it said; the server only acknowledges the client's cut.
        return [
            ev.event(
                "conversation.item.truncated",
                item_id=message.item_id,
                content_index=message.content_index,
                audio_end_ms=message.audio_end_ms,
            )
        ]

    def _delete_item(self, message: msg.ItemDelete) -> list[Output]:
        self.items.pop(message.item_id)
        return [ev.event("conversation.item.deleted", item_id=message.item_id)]

    def _create_response(self, message: msg.ResponseCreate) -> list[Output]:
        active = self._responses.active
        if active is not None:
            return _refusal(
                message,
                "conversation_already_has_active_response",
                f"conversation already has an active response {active.id}",
            )
        out = self._ensure_open()
        out += self._release(self._deadlines.last_message)
        # It counts from the model's next frame: what the client sent before it is
        # still queued ahead, and turns the model takes while hearing it are not it.
        out += self._responses.open(
            self._modalities, message.metadata, after=self._frames.submitted
        )
        if self._turns.speaking:
            # The model is already speaking (a turn whose response ended): this one
            # carries the rest of it.
            out += self._responses.open_message(self._modalities)
        return out + self._claim()

    def _cancel_response(self, message: msg.ResponseCancel) -> list[Output]:
        active = self._responses.active
        wanted = message.response_id
        if active is None or (wanted is not None and wanted != active.id):
            return _refusal(
                message, "response_cancel_not_active", "there is no active response to cancel"
            )
        return self._cut("client_cancelled")

    def _cut(self, reason: str) -> list[Output]:
        """End the active response cancelled. The model cannot be interrupted: the
        rest of its turn is dropped."""
        self._turns.mute()
        self._responses.drop_held()
        return [*self._responses.finish("cancelled", self._modalities, reason=reason)]

    def _claim(self) -> list[Output]:
        """A response waiting for a turn takes the held one, once the model has heard
        everything sent before the response was asked for."""
        if not (self._turns.held and self._responses.ready(self._frames.done)):
            return []
        self._turns.claim()
        return [*self._responses.claim(self._modalities)]

    # --- the model's side -------------------------------------------------------------------

    def _ensure_open(self) -> list[Output]:
        if self.model_state is not ModelState.CLOSED:
            return []
        self.model_state = advance(self.model_state, Trigger.OPEN)
        self._applied = sess.prefilled(self.session)
        prompt = sess.system_prompt(self.session)
        counted = self._counts.get(prompt) if prompt else 0
        # Counted off the loop when the prompt was set; a prompt never counted there (the
        # default instructions) is counted here once.
        self._prompt_tokens = (
            counted if isinstance(counted, int) else (self._count_tokens(prompt) if prompt else 0)
        )
        return [OpenModel(prompt)]

    def _frame(self, samples: Samples, now: float) -> RunAudio:
        """One frame (client audio, or silence) for the model, numbered in order (its
        tag); ``now`` is when it came, which the frame latency runs from."""
        tag = self._frames.submitted
        self._frames.submitted += 1
        return RunAudio(tag, samples, self.figures.input_sample_rate, now)

    def opened(
        self, failure: str | None, now: float, *, cached_tokens: int = 0, prompt_tokens: int = 0
    ) -> list[Output]:
        """The engine finished opening the model session (``failure``: why not;
        ``prompt_tokens``: the prompt's tokens as the model read them, when it says;
        ``cached_tokens``: how many of them came from the prompt cache)."""
        if failure is None:
            if prompt_tokens:
                self._prompt_tokens = prompt_tokens
            self.usage.text_tokens += self._prompt_tokens
            self.usage.cached_tokens += min(cached_tokens, self._prompt_tokens)
            self.model_state = advance(self.model_state, Trigger.OPENED)
            self._frames.start = now
            return self._release(now)
        self.model_state = advance(self.model_state, Trigger.OPEN_FAILED)
        self._applied = None
        self._held.clear()  # as queued frames are, with no session to run them
        out: list[Output] = [
            ev.error(
                f"the model session could not be opened: {failure}",
                code="session_initialization_failed",
                type_="server_error",
            )
        ]
        out += self._responses.finish("failed", self._modalities)
        return out

    def frame_dropped(self) -> None:
        """A frame queued for the model did not run (the session is not open)."""
        self._frames.done += 1

    def frame_done(self, events: list[ModelEvent]) -> list[Output]:
        """One frame's events: the dialect's responses and user items for it."""
        number = self._frames.done
        self._frames.done += 1
        self.usage.audio_frames += 1
        frame = channels(events, number)
        vad = sess.vad(self.session)
        responds = sess.server_responds(self.session)
        # Where only the client opens responses, a turn that opens with none ready
        # for it is held: unheard unless a response.create claims it.
        hold = not responds and not self._responses.ready(number)
        step = self._turns.frame(frame, vad=vad, hold=hold)
        modalities = self._modalities
        out = self._user_events(step.user)
        started = any(isinstance(beat, SpeechStarted) for beat in step.user)
        if started and sess.interrupts(self.session) and self._responses.counts(number):
            # Speech the client sent before asking for the response does not cut it.
            out += self._cut("turn_detected")
        calls = [call for delta in frame.functions for call in self._calls.push(delta)]
        self._function_tokens += len(frame.functions)
        call_tokens = 0
        if calls:
            call_tokens, self._function_tokens = self._function_tokens, 0
        made = FrameOutput(
            self._model_audio(frame),
            frame.spoken,
            tuple(calls),
            spoken_tokens=sum(isinstance(event, AssistantTextDelta) for event in events),
            call_tokens=call_tokens,
            wire=self.output_format,
        )
        out += self._model_output(step, made, responds=responds)
        out += self._responses.waited(number, modalities)
        if step.ended and self._responses.speaking:
            out += self._responses.finish("completed", modalities)
        return out + self._claim()

    def _model_output(self, step: TurnStep, frame: FrameOutput, *, responds: bool) -> list[Output]:
        """What the model made on one frame, for the client: into the active
        response, kept with a held turn, or dropped. Only with ``responds`` does
        output with no response open one."""
        if self._turns.held:
            if not self._responses.hold(frame):
                self._turns.mute()  # too long to keep: it goes unheard to its end
            return []
        self._responses.drop_held()
        out: list[Output] = []
        modalities = self._modalities
        if step.speak and self._turns.speaking and (responds or self._responses.active is not None):
            out += self._responses.speak(modalities)
        if self._responses.active is not None or (responds and frame.calls):
            out += self._responses.frame(frame, modalities)
        return out

    def _model_audio(self, frame: Channels) -> Samples | None:
        """Every frame of the model's audio is resampled (the stream never jumps);
        only an open message's reach the client."""
        if frame.audio is None:
            return None
        return self._resampler.push(frame.audio.samples, frame.audio.sample_rate)

    def _user_events(self, beats: Sequence[UserBeat]) -> list[Output]:
        out: list[Output] = []
        for beat in beats:
            out += render.user_beat(beat, self._log)
        return out

    def fed(self, failure: str | None, now: float, tokens: int = 0) -> list[Output]:
        """The engine gave the model a tool's output of ``tokens`` tokens (``failure``: why
        it could not)."""
        self._feeds_queued -= 1
        if failure is None:
            self.usage.text_tokens += tokens
            return []
        return [
            ev.error(
                f"the tool output did not reach the model: {failure}",
                code="invalid_value",
                type_="invalid_request_error",
                param="item.output",
            )
        ]

    def failed(self, message: str, *, lost: bool, now: float) -> list[Output]:
        """The engine failed a frame; a lost session ends the connection."""
        out: list[Output] = [
            ev.error(f"the model failed: {message}", code="inference_error", type_="server_error")
        ]
        if lost:
            out += self._responses.finish("failed", self._modalities)
            self._close(now)
            out.append(Close(CLOSE_INTERNAL, message[:120]))
        return out

    # --- time ---------------------------------------------------------------------------------

    def sending(self, now: float) -> None:
        """A socket write starts (the stalled-reader clock runs until ``sent``)."""
        self._deadlines.sending(now)

    def sent(self, now: float) -> None:
        self._deadlines.sent(now)

    def _close(self, now: float) -> None:
        """Stop serving the client: from ``now`` on only the close is owed it."""
        if self.phase is Phase.SERVING:
            self.phase = advance(self.phase, Trigger.CLOSE)
            self._deadlines.closing_since = now

    def stall_deadline(self) -> float | None:
        """When a client that reads nothing is dropped (``None``: nothing is owed it);
        see :meth:`Deadlines.stall`."""
        if self.phase is Phase.DROPPED:
            return None
        return self._deadlines.stall()

    def tick(self, now: float) -> list[Output]:
        """Silence to keep the model's clock running; the stalled-reader and idle
        timeouts."""
        stall = self.stall_deadline()
        if stall is not None and now >= stall:
            self._close(now)
            self.phase = advance(self.phase, Trigger.DROP)
            return [Close(CLOSE_POLICY, "client stopped reading", now=True)]
        if self.closed:
            return []
        if self._deadlines.idle_passed(now):
            self._close(now)
            message = f"no client event for {self.limits.idle_timeout:g} s; closing"
            return [ev.error(message, code="idle_timeout"), Close(CLOSE_POLICY, message)]
        if self.model_state is not ModelState.OPEN:
            return []
        return [self._frame(self._silence, now) for _ in range(self._frames.silence_due(now))]

    def next_tick(self, now: float) -> float:
        """When ``tick`` next has something to do (at the latest): the client's
        deadlines (:meth:`Deadlines.next_check`), and silence once the model runs."""
        at = self._deadlines.next_check(
            now, self._poll, closed=self.closed, dropped=self.phase is Phase.DROPPED
        )
        if self.closed or self.model_state is not ModelState.OPEN:
            return at
        return min(at, self._frames.next_frame(now))


def _refusal(
    message: msg.ClientMessage, code: str, text: str, *, param: str | None = None
) -> list[Output]:
    """A refusal of ``message`` that the session's state decides (the session goes on)."""
    return [ev.error(text, code=code, param=param, client_event_id=message.event_id)]
