"""What every client stack's Live conversation does and records, whichever stack holds it.

A conversation: ``session.start`` with :data:`INSTRUCTIONS`, a second of speech and then
silence streamed at the pace of a microphone (the model's timeline runs on the audio it
hears), the model's spoken answer, a ``session.delegation.created`` answered with
``session.commentary.append`` (:data:`COMMENTARY`, the delegation's id) and acknowledged
with ``session.commentary.appended``, the model relaying the commentary aloud, then
``session.close`` and ``session.closed``.

:class:`Heard` takes every server event as it arrives, validates it strictly
(:func:`tests.live.validate.validate_live`) and lets the exchange wait for the next step;
:meth:`Heard.record` is what an exchange returns, JSON-ready so that one run in another
process (Pipecat's) can print it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np

from tests.live.validate import validate_live

API_KEY = "sk-local-test"
RATE = 24_000
"""The rate all three stacks speak (``audio/pcm``, PCM16 mono)."""
CHUNK = RATE // 50
"""Samples per append: 20 ms, a room's frame."""
MODEL = "gpt-live-1"
INSTRUCTIONS = "You are a weather assistant. Ask the application for the weather."
COMMENTARY = "sunny in Paris"
"""What the application answers the delegation with (the demo speaks it back)."""
STEP = 120.0
"""Seconds any one step may wait: the demo's network runs on the CPU in CI, and opens
with the delegate tool's prompt a token a slice."""
RELAYED_WITHIN = 20.0
"""Seconds after the commentary is acknowledged that the exchange listens for it to be
spoken (the demo speaks it at once; a bound, not a speed claim)."""


def speech() -> bytes:
    """About a second of speech-like sound (the demo's turn layer hears it as a turn),
    as 24 kHz PCM16."""
    from realtime.audio import prepare_input
    from tests.models_fixtures import speechlike

    pcm = prepare_input(speechlike(12), 16000, extra_seconds=0.0, to_rate=RATE)
    return pcm.astype("<i2").tobytes()


def microphone() -> Any:
    """The 20 ms chunks a microphone delivers: :func:`speech`, then silence for ever."""
    pcm = speech()
    step = CHUNK * 2
    for i in range(0, len(pcm), step):
        yield pcm[i : i + step].ljust(step, b"\0")
    while True:
        yield bytes(step)


async def stream(send: Callable[[bytes], Any], stop: asyncio.Event) -> None:
    """Feed :func:`microphone` to ``send`` (sync or async) at real-time pace until
    ``stop`` is set."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for n, chunk in enumerate(microphone()):
        if stop.is_set():
            return
        sent = send(chunk)
        if asyncio.iscoroutine(sent):
            await sent
        await asyncio.sleep(max(0.0, start + (n + 1) * CHUNK / RATE - loop.time()))


def loud(pcm: bytes) -> bool:
    """Whether PCM16 ``pcm`` holds sound rather than silence."""
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], "<i2")
    return bool(samples.size) and int(np.abs(samples.astype(np.int32)).max()) > 64


class Heard:
    """The server events of one conversation, in order, each validated on arrival."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        """Every event; an audio delta's ``delta`` is replaced by its decoded size, and
        ``loud`` says whether it held sound."""
        self.audio = 0
        """Bytes of output audio received."""
        self.sent: list[dict[str, Any]] = []
        """What the exchange itself sent that the test checks (the commentary)."""
        self.failure: BaseException | None = None
        """What ended the exchange's reading early (an event that failed validation)."""
        self.ended = False
        """Whether the server closed the socket."""
        self._changed = asyncio.Event()

    def fail(self, failure: BaseException) -> None:
        """The reader stopped on ``failure``: every wait raises it from now on."""
        self.failure = failure
        self._changed.set()

    def end(self) -> None:
        """The server closed the socket."""
        self.ended = True
        self._changed.set()

    def add(self, event: dict[str, Any]) -> None:
        validate_live(event)
        if event["type"] == "session.output_audio.delta":
            pcm = base64.b64decode(event["delta"])
            self.audio += len(pcm)
            event = {**event, "delta": len(pcm), "loud": loud(pcm)}
        self.events.append(event)
        self._changed.set()

    def first(self, type_: str, **fields: Any) -> dict[str, Any] | None:
        for event in self.events:
            if event["type"] == type_ and all(event.get(k) == v for k, v in fields.items()):
                return event
        return None

    async def until(self, type_: str, timeout: float = STEP, **fields: Any) -> dict[str, Any]:
        """The first event of ``type_`` (with ``fields``), received already or next;
        TimeoutError naming what was seen instead."""

        async def wait() -> dict[str, Any]:
            while (found := self.first(type_, **fields)) is None:
                if self.failure is not None:
                    raise AssertionError(f"while waiting for {type_}") from self.failure
                if self.ended:
                    raise AssertionError(f"the server closed the socket before {type_}")
                if (error := self.first("error")) is not None:
                    raise AssertionError(f"error while waiting for {type_}: {error}")
                self._changed.clear()
                await self._changed.wait()
            return found

        try:
            return await asyncio.wait_for(wait(), timeout)
        except TimeoutError:
            seen = [e["type"] for e in self.events if e["type"] != "session.output_audio.delta"]
            raise TimeoutError(f"no {type_} {fields or ''} in {timeout} s; seen: {seen}") from None

    async def relayed(self, after: dict[str, Any], text: str) -> None:
        """Until the model's transcript after event ``after`` contains ``text`` and
        sound came with it (or :data:`RELAYED_WITHIN` passes)."""

        async def wait() -> None:
            while not (text in self.said_after(after) and self.loud_after(after)):
                if self.failure is not None or self.ended:
                    return
                self._changed.clear()
                await self._changed.wait()

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wait(), RELAYED_WITHIN)

    def said_after(self, event: dict[str, Any]) -> str:
        """The model's transcript (``session.output_transcript.delta``) after ``event``."""
        later = self.events[self.events.index(event) + 1 :]
        return "".join(e["delta"] for e in later if e["type"] == "session.output_transcript.delta")

    def loud_after(self, event: dict[str, Any]) -> int:
        """Bytes of loud output audio after ``event``."""
        later = self.events[self.events.index(event) + 1 :]
        return sum(
            e["delta"] for e in later if e["type"] == "session.output_audio.delta" and e["loud"]
        )

    def record(self) -> dict[str, Any]:
        return {"events": self.events, "sent": self.sent, "audio": self.audio}


def check(record: dict[str, Any], relayed: str) -> None:
    """The whole conversation happened, in order: AssertionError naming what did not.

    ``relayed``: what the model's transcript must say once the commentary is in.
    """
    events: list[dict[str, Any]] = record["events"]
    types = [e["type"] for e in events]
    errors = [e for e in events if e["type"] == "error"]
    assert not errors, errors
    assert types[0] == "session.started", types[:5]
    assert events[0]["session"]["model"], events[0]  # the server names the model it serves
    assert events[0]["session"].get("instructions") == INSTRUCTIONS, events[0]
    assert record["audio"] > 0, "no session.output_audio.delta"
    delegated = next(e for e in events if e["type"] == "session.delegation.created")
    assert delegated["delegation"]["target"] == "client", delegated
    (answer, *_) = [
        s
        for s in record["sent"]
        if s["type"] == "session.commentary.append"
        and s.get("delegation_id") == delegated["delegation"]["id"]
    ] or [None]
    assert answer is not None, ("no commentary for the delegation", record["sent"])
    assert COMMENTARY in answer["content"], answer
    appended = [e for e in events if e["type"] == "session.commentary.appended"]
    assert appended, "no session.commentary.appended"
    if answer.get("event_id") is not None:
        assert appended[0].get("client_event_id") == answer["event_id"], (appended, answer)
    said = "".join(
        e["delta"]
        for e in events[events.index(appended[0]) + 1 :]
        if e["type"] == "session.output_transcript.delta"
    )
    assert relayed in said, (relayed, said)
    loud_after = [
        e
        for e in events[events.index(appended[0]) + 1 :]
        if e["type"] == "session.output_audio.delta" and e["loud"]
    ]
    assert loud_after, "the relayed commentary came with no sound"
    for e in events:
        if e["type"] in ("session.input_transcript.delta", "session.output_transcript.delta"):
            assert 0 <= e["start_ms"] <= e["end_ms"], e
    assert types[-1] == "session.closed", types[-5:]
    assert events[-1]["reason"] == "close_requested", events[-1]
    assert types.count("session.closed") == 1, types
