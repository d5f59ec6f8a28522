"""What command-line clients share beyond the protocol: exit codes and their flags,
retrying a busy server, audio checks, live transcript printing and framing.

``examples/voicechat_file_client.py`` and ``examples/voicechat_microphone.py`` are
built on it (see docs/client.md); so can any other terminal client.
"""

from __future__ import annotations

import argparse
import base64
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final, TextIO, TypeVar

import numpy as np
import numpy.typing as npt
import trio

from realtime.client import (
    AudioDelta,
    BadURL,
    ClientError,
    Forbidden,
    FunctionDelta,
    RealtimeClient,
    ServerBusy,
    ServerEvent,
    ServerUnreachable,
    SessionUpdated,
    TextDelta,
    TranscriptDelta,
    Unauthorized,
    UpgradeRejected,
)
from realtime.models.base import VOICECHAT_FIGURES
from realtime.transcript import TranscriptPrinter as BaseTranscriptPrinter

PCM16 = npt.NDArray[np.int16]
Event = dict[str, Any]

FRAME_SECONDS = VOICECHAT_FIGURES.frame_seconds
"""VoiceChat's 80 ms step, for a client that must pace before ``session.updated``;
once connected, ``RealtimeClient.frame_seconds`` is the served model's."""

EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_CODES: Final[tuple[tuple[type[ClientError], int], ...]] = (
    (ServerUnreachable, 3),
    (BadURL, 4),
    (Unauthorized, 5),
    (Forbidden, 6),
    (ServerBusy, 7),  # 1013, server_busy, or HTTP 503 before the upgrade (a full fleet)
    (UpgradeRejected, 4),  # any other refused upgrade, e.g. 404: a wrong path
)
"""Most specific first: Unauthorized, Forbidden and BusyUpgrade are UpgradeRejected too."""

EXIT_EPILOG: Final = """\
exit status:
  0    the answer ended with response.done
  1    the server sent an error, closed early or stalled (or the session did not
       open within --open-timeout, or a dropped connection could not be resumed)
  2    usage error (bad arguments; for the microphone client: no usable audio device)
  3    the server is unreachable (nothing listens at HOST:PORT)
  4    wrong URL: not ws:// or wss://, or no /v1/realtime at that path (e.g. HTTP 404)
  5    API key refused (HTTP 401): pass --api-key KEY
  6    client refused (HTTP 403, usually its Origin)
  7    server busy: no conversation is free (close code 1013, or HTTP 503 from a
       balancer or a draining server); try again later (--retry N waits and retries)
  130  interrupted
"""


RETRY_HINT: Final = "--retry N waits and tries again up to N times"

OPEN_TIMEOUT: Final = 600.0
"""Seconds a client waits for its session to open (``session.updated``): a server
reads a long system prompt before it answers, and the first read of a new one can
take minutes on a small machine (docs/client.md)."""


def exit_code(exc: ClientError) -> int:
    """The script's exit status for ``exc`` (see :data:`EXIT_EPILOG`)."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_FAILED


def report(exc: ClientError, err: TextIO | None = None) -> int:
    """Print ``exc`` as one line on stderr; return its exit status. A busy server's
    line ends with the flag that waits for it."""
    hint = f" ({RETRY_HINT})" if isinstance(exc, ServerBusy) else ""
    print(f"error: {exc}{hint}", file=err if err is not None else sys.stderr)
    return exit_code(exc)


N = TypeVar("N", int, float)


def checked(
    kind: Callable[[str], N], message: str
) -> Callable[[Callable[[N], bool]], Callable[[str], N]]:
    """Makes a check of a number an argparse type: the text as ``kind``, refused with
    ``message`` when the check fails. Text that is no ``kind`` at all argparse reports
    as an ``invalid`` value of the check's name."""

    def as_type(valid: Callable[[N], bool]) -> Callable[[str], N]:
        def parse(text: str) -> N:
            value = kind(text)
            if not valid(value):
                raise argparse.ArgumentTypeError(message)
            return value

        parse.__name__ = valid.__name__
        return parse

    return as_type


@checked(int, "expected an integer from 0 to 100")
def _retries(value: int) -> bool:
    return 0 <= value <= 100


def client_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """An example client's parser: the exit statuses (:data:`EXIT_EPILOG`) follow the
    flags in ``--help``, laid out as written."""
    return argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=EXIT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


@checked(float, "expected seconds > 0")
def _seconds(value: float) -> bool:
    return 0 < value < float("inf")


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    """``--api-key``, ``--origin``, ``--retry``, ``--no-resume`` and ``--open-timeout``:
    what a client shows a server that checks them, how long it keeps trying a busy one,
    whether it resumes after a drop, and how long it waits for its session to open."""
    parser.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    parser.add_argument("--origin", default=None, help="send this Origin header (browser-like)")
    parser.add_argument(
        "--retry",
        type=_retries,
        default=0,
        metavar="N",
        help="when the server (or its balancer) is busy, wait and try again up to N times "
        "(its Retry-After, else 1, 2, 4 ... up to 30 s; default 0: exit 7 at once)",
    )
    parser.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="do not ask for a resumable session: a dropped connection ends it (by default "
        "the client reconnects and resumes within the grace period the server offers)",
    )
    parser.add_argument(
        "--open-timeout",
        type=_seconds,
        default=OPEN_TIMEOUT,
        metavar="SECONDS",
        help="wait this long for the session to open: the server reads the system prompt "
        "first, and a long one it has not read before can take minutes "
        f"(default {OPEN_TIMEOUT:g}; past it: exit 1)",
    )


async def open_session(
    conn: RealtimeClient,
    open_timeout: float,
    *,
    system_prompt: str | None = None,
    seed: int = 0,
) -> SessionUpdated:
    """``conn.configure`` within ``open_timeout`` seconds, else a :class:`ClientError`
    that says why the wait may be long and how to make it longer."""
    try:
        with trio.fail_after(open_timeout):
            return await conn.configure(system_prompt=system_prompt, seed=seed)
    except trio.TooSlowError:
        raise ClientError(
            f"the session did not open within {open_timeout:g} s (the server reads the "
            "system prompt first, and a long one it has not read before can take "
            "minutes; --open-timeout SECONDS waits longer)"
        ) from None


T = TypeVar("T")

RETRY_CAP_SECONDS: Final = 30.0


def retry_wait(exc: ServerBusy, attempt: int) -> float:
    """Seconds before retry ``attempt`` (0-based): the server's ``Retry-After`` when it
    sent one, else 1, 2, 4 ... seconds, never over 30."""
    hinted = getattr(exc, "retry_after", None)
    if isinstance(hinted, (int, float)) and hinted >= 0:
        return min(float(hinted), RETRY_CAP_SECONDS)
    return min(2.0**attempt, RETRY_CAP_SECONDS)


async def retrying_busy(
    run: Callable[[], Awaitable[T]], retries: int, err: TextIO | None = None
) -> T:
    """``run()``, tried again up to ``retries`` times while the server is busy (one line
    on stderr per wait); any other error, or the last busy, is raised."""
    for attempt in range(retries + 1):
        try:
            return await run()
        except ServerBusy as exc:
            if attempt == retries:
                raise
            wait = retry_wait(exc, attempt)
            print(
                f"{exc}; retrying in {wait:g} s ({attempt + 1} of {retries})",
                file=err if err is not None else sys.stderr,
                flush=True,
            )
            await trio.sleep(wait)
    raise AssertionError("not reached")  # pragma: no cover


class LinkNotices:
    """One line on ``err`` when the connection drops and when the session is resumed
    (``on_link`` of :func:`realtime.client.connect`)."""

    def __init__(self, err: TextIO | None = None) -> None:
        self.err = err

    def __call__(self, change: str) -> None:
        text = {
            "reconnecting": "connection lost: reconnecting to resume the session",
            "resumed": "session resumed",
        }.get(change, change)
        print(text, file=self.err if self.err is not None else sys.stderr, flush=True)


def redact_audio(event: Event) -> Event:
    """A copy fit for a log: base64 audio replaced by its sample count."""
    if event.get("type") != "response.audio.delta" or not isinstance(event.get("delta"), str):
        return event
    out = dict(event)
    out["delta"] = len(base64.b64decode(event["delta"])) // 2
    return out


class AudioDeltaChecker:
    """Checks the audio contract: frames of ``frame_samples`` at ``sample_rate`` (the
    served model's; VoiceChat's 1764 at 22 050 Hz by default) with increasing
    ``frame_index``."""

    def __init__(
        self,
        frame_samples: int = VOICECHAT_FIGURES.output_frame_samples,
        sample_rate: int = VOICECHAT_FIGURES.output_sample_rate,
    ) -> None:
        self.frame_samples = frame_samples
        self.sample_rate = sample_rate
        self.frames = 0
        self.last_frame_index: int | None = None

    @classmethod
    def of(cls, conn: RealtimeClient) -> AudioDeltaChecker:
        """A checker for what the connection's ``session.updated`` announced."""
        return cls(conn.output_frame_samples, conn.output_sample_rate)

    def check(self, event: AudioDelta) -> PCM16:
        pcm = event.pcm()
        index = event.frame_index
        if not isinstance(index, int):
            raise ClientError(f"response.audio.delta without an integer frame_index: {index!r}")
        if self.last_frame_index is not None and index <= self.last_frame_index:
            raise ClientError(
                f"audio frame_index went from {self.last_frame_index} to {index} (must increase)"
            )
        if pcm.size != self.frame_samples:
            raise ClientError(
                f"audio frame {index} has {pcm.size} samples, expected {self.frame_samples}"
            )
        if event.sample_rate != self.sample_rate:
            raise ClientError(
                f"audio frame {index} is at {event.sample_rate} Hz, expected {self.sample_rate}"
            )
        self.last_frame_index = index
        self.frames += 1
        return pcm


CHANNELS: Final[dict[type[ServerEvent], str]] = {
    TranscriptDelta: "user",
    TextDelta: "assistant",
    FunctionDelta: "function",
}
"""Text event -> the channel label the clients print (``[user] ...``)."""


class TranscriptPrinter(BaseTranscriptPrinter):
    """:class:`realtime.transcript.TranscriptPrinter` fed with client events: the
    same growing ``[channel] ...`` lines as ``realtime generate --stream``."""

    def feed(self, event: ServerEvent) -> None:
        if isinstance(event, TranscriptDelta | TextDelta | FunctionDelta):
            self.write(CHANNELS[type(event)], event.delta)


class FrameFramer:
    """Cuts a stream of PCM16 chunks into frames of the model's step
    (``RealtimeClient.frame_samples``; VoiceChat's 1280 by default)."""

    def __init__(self, frame_samples: int = VOICECHAT_FIGURES.frame_samples) -> None:
        self.frame_samples = frame_samples
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, pcm: PCM16) -> list[PCM16]:
        data = np.concatenate([self._pending, np.asarray(pcm, dtype=np.int16)])
        size = self.frame_samples
        whole = data.size // size * size
        frames = [data[i : i + size] for i in range(0, whole, size)]
        self._pending = data[whole:]
        return frames

    def flush(self) -> PCM16:
        """The partial frame left over (the server pads it on commit)."""
        rest, self._pending = self._pending, np.zeros(0, dtype=np.int16)
        return rest
