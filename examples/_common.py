"""What the two example clients share beyond :mod:`realtime.client`: exit codes,
audio checks, live transcript printing, framing and stream resampling.

``voicechat_file_client.py`` and ``voicechat_microphone.py`` speak ``/v1/realtime``
through :mod:`realtime.client` (see docs/client.md); what is left here is what a
command-line client needs on top of it.
"""

from __future__ import annotations

import base64
import sys
from typing import Any, Final, TextIO

import numpy as np
import numpy.typing as npt

from realtime.client import (
    AudioDelta,
    BadURL,
    ClientError,
    Forbidden,
    FunctionDelta,
    ServerBusy,
    ServerEvent,
    ServerUnreachable,
    TextDelta,
    TranscriptDelta,
    Unauthorized,
    UpgradeRejected,
)
from realtime.models.base import (
    FRAME_SAMPLES,
    INPUT_SAMPLE_RATE,
    OUTPUT_FRAME_SAMPLES,
    OUTPUT_SAMPLE_RATE,
    Samples,
)
from realtime.transcript import TranscriptPrinter as BaseTranscriptPrinter

PCM16 = npt.NDArray[np.int16]
Event = dict[str, Any]

FRAME_SECONDS = FRAME_SAMPLES / INPUT_SAMPLE_RATE
"""80 ms: the model's step and the cadence at which live clients send audio."""

EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_CODES: Final[tuple[tuple[type[ClientError], int], ...]] = (
    (ServerUnreachable, 3),
    (BadURL, 4),
    (Unauthorized, 5),
    (Forbidden, 6),
    (UpgradeRejected, 4),  # any other refused upgrade, e.g. 404: a wrong path
    (ServerBusy, 7),
)
"""Most specific first: Unauthorized and Forbidden are UpgradeRejected too."""

EXIT_EPILOG: Final = """\
exit status:
  0    the answer ended with response.done
  1    the server sent an error, closed early or stalled
  2    usage error (bad arguments; for the microphone client: no usable audio device)
  3    the server is unreachable (nothing listens at HOST:PORT)
  4    wrong URL: not ws:// or wss://, or no /v1/realtime at that path (e.g. HTTP 404)
  5    API key refused (HTTP 401): pass --api-key KEY
  6    client refused (HTTP 403, usually its Origin)
  7    server busy: another session is active (close code 1013); try again later
  130  interrupted
"""


def exit_code(exc: ClientError) -> int:
    """The script's exit status for ``exc`` (see :data:`EXIT_EPILOG`)."""
    for kind, code in EXIT_CODES:
        if isinstance(exc, kind):
            return code
    return EXIT_FAILED


def report(exc: ClientError, err: TextIO | None = None) -> int:
    """Print ``exc`` as one line on stderr; return its exit status."""
    print(f"error: {exc}", file=err if err is not None else sys.stderr)
    return exit_code(exc)


def redact_audio(event: Event) -> Event:
    """A copy fit for a log: base64 audio replaced by its sample count."""
    if event.get("type") != "response.audio.delta" or not isinstance(event.get("delta"), str):
        return event
    out = dict(event)
    out["delta"] = len(base64.b64decode(event["delta"])) // 2
    return out


class AudioDeltaChecker:
    """Checks the audio contract: 1764-sample frames with increasing ``frame_index``."""

    def __init__(self) -> None:
        self.frames = 0
        self.last_frame_index: int | None = None

    def check(self, event: AudioDelta) -> PCM16:
        pcm = event.pcm()
        index = event.frame_index
        if not isinstance(index, int):
            raise ClientError(f"response.audio.delta without an integer frame_index: {index!r}")
        if self.last_frame_index is not None and index <= self.last_frame_index:
            raise ClientError(
                f"audio frame_index went from {self.last_frame_index} to {index} (must increase)"
            )
        if pcm.size != OUTPUT_FRAME_SAMPLES:
            raise ClientError(
                f"audio frame {index} has {pcm.size} samples, expected {OUTPUT_FRAME_SAMPLES}"
            )
        if event.sample_rate != OUTPUT_SAMPLE_RATE:
            raise ClientError(f"audio frame {index} is at {event.sample_rate} Hz")
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
    """Cuts a stream of PCM16 chunks into 1280-sample frames (the model's 80 ms step)."""

    def __init__(self) -> None:
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, pcm: PCM16) -> list[PCM16]:
        data = np.concatenate([self._pending, np.asarray(pcm, dtype=np.int16)])
        whole = data.size // FRAME_SAMPLES * FRAME_SAMPLES
        frames = [data[i : i + FRAME_SAMPLES] for i in range(0, whole, FRAME_SAMPLES)]
        self._pending = data[whole:]
        return frames

    def flush(self) -> PCM16:
        """The partial frame left over (the server pads it on commit)."""
        rest, self._pending = self._pending, np.zeros(0, dtype=np.int16)
        return rest


class StreamResampler:
    """Chunk-by-chunk resampling without clicks at chunk edges.

    ``realtime.audio.resample`` resamples a whole signal at once; a live stream
    arrives in 80 ms pieces and resampling each piece alone would put an edge
    artefact every 80 ms, so this keeps soxr's filter state between chunks.
    """

    def __init__(self, from_rate: int, to_rate: int) -> None:
        self.from_rate = from_rate
        self.to_rate = to_rate
        self._stream: Any = None
        if from_rate != to_rate:
            import soxr

            self._stream = soxr.ResampleStream(from_rate, to_rate, 1, dtype="float32")

    def process(self, samples: Samples, *, last: bool = False) -> Samples:
        x = np.asarray(samples, dtype=np.float32)
        if self._stream is None:
            return x
        out = self._stream.resample_chunk(x, last=last)
        return np.asarray(out, dtype=np.float32)
