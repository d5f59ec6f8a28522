"""Drive a WAV file through ``/v1/realtime`` and save the spoken answer.

    python examples/voicechat_file_client.py ws://127.0.0.1:8080/v1/realtime IN.wav OUT.wav \\
        [--system-prompt TEXT] [--seed N] [--extra-seconds 3] [--realtime] \\
        [--events OUT.jsonl] [--api-key KEY] [--origin ORIGIN]

The input is prepared exactly as ``realtime generate`` prepares it (16 kHz mono
PCM16 plus ``--extra-seconds`` of silence so the model can finish speaking), and
the audio deltas are written unchanged, so for the same WAV, prompt and seed the
output equals ``realtime generate --stream`` byte for byte.

The protocol goes through :mod:`realtime.client`. Exit status: 0 on
``response.done``; a distinct code for each way of not getting a session (see
``--help`` and docs/client.md); 1 if the server errors, closes early or stalls.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import trio

if importlib.util.find_spec("realtime") is None:  # a script run from an uninstalled checkout
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))

from _common import (
    EXIT_EPILOG,
    FRAME_SECONDS,
    PCM16,
    AudioDeltaChecker,
    Event,
    FrameFramer,
    TranscriptPrinter,
    redact_audio,
    report,
)

from realtime.audio import prepare_input, read_wav, write_wav_pcm16
from realtime.client import (
    AudioDelta,
    ClientError,
    ResponseCancelled,
    ResponseDone,
    ServerBusy,
    ServerClosed,
    SessionUpdated,
    append_message,
    connect,
)
from realtime.models.base import INPUT_SAMPLE_RATE, OUTPUT_SAMPLE_RATE


@dataclass
class FileClientResult:
    """What one run produced, plus the figures the script prints."""

    pcm: PCM16
    frames: int
    session_id: str | None
    model: str | None
    texts: dict[str, str]
    frames_sent: int
    seconds_to_ready: float
    seconds_to_first_audio: float | None
    seconds_total: float
    event_counts: dict[str, int] = field(default_factory=dict)

    @property
    def audio_seconds(self) -> float:
        return self.pcm.size / OUTPUT_SAMPLE_RATE

    @property
    def real_time_factor(self) -> float:
        """Wall time per second of input fed; below 1 keeps up with live speech."""
        fed = self.frames_sent * FRAME_SECONDS
        return self.seconds_total / fed if fed else float("nan")


class _Progress:
    """How far the model has got, so a fast sender stays a bounded distance ahead.

    The server refuses input queued beyond ``--max-pending-audio-seconds``; the
    model emits one audio frame per input frame, so the highest ``frame_index``
    seen tells how much of what was sent has been run.
    """

    def __init__(self) -> None:
        self.done_frames = 0
        self._changed = trio.Event()

    def advance(self, frame_index: int) -> None:
        if frame_index + 1 > self.done_frames:
            self.done_frames = frame_index + 1
            self._changed.set()
            self._changed = trio.Event()

    async def wait_until(self, frames: int) -> None:
        while self.done_frames < frames:
            await self._changed.wait()


async def run_file_client(
    url: str,
    pcm: PCM16,
    *,
    system_prompt: str | None = None,
    seed: int = 0,
    realtime: bool = False,
    api_key: str | None = None,
    origin: str | None = None,
    on_ready: Callable[[SessionUpdated], None] | None = None,
    on_event: Callable[[Event], None] | None = None,
    printer: TranscriptPrinter | None = None,
    max_ahead_seconds: float = 8.0,
    event_timeout: float = 60.0,
) -> FileClientResult:
    """Send ``pcm`` (16 kHz PCM16) through one session; return the answer's audio.

    Sending runs concurrently with receiving: as fast as the server takes it (but
    at most ``max_ahead_seconds`` ahead of the model), or every 80 ms with
    ``realtime``. ``on_ready`` runs once the session is configured, before any
    audio goes out. Raises :class:`ClientError` on any failure to get a session,
    server error, early close, protocol violation, or ``event_timeout`` seconds
    without an event.
    """
    pcm = np.asarray(pcm, dtype=np.int16)
    if pcm.ndim != 1 or pcm.size == 0:
        raise ClientError("input audio is empty")
    started = time.perf_counter()
    checker = AudioDeltaChecker()
    progress = _Progress()
    chunks: list[PCM16] = []
    counts: dict[str, int] = {}
    first_audio: float | None = None
    framer = FrameFramer()
    messages = [append_message(f) for f in framer.push(pcm)]
    tail = framer.flush()
    if tail.size:
        messages.append(append_message(tail))
    max_ahead = max(1, int(max_ahead_seconds / FRAME_SECONDS))
    printer = printer or TranscriptPrinter()

    def seen(event: Event) -> None:
        counts[event["type"]] = counts.get(event["type"], 0) + 1
        if on_event is not None:
            on_event(event)

    async with connect(url, api_key=api_key, origin=origin) as conn:
        with trio.fail_after(event_timeout):
            updated = await conn.configure(system_prompt=system_prompt, seed=seed)
        assert conn.created is not None
        seen(conn.created.raw)
        seen(updated.raw)
        ready = time.perf_counter() - started
        if on_ready is not None:
            on_ready(updated)
        sent = 0

        async def send_audio() -> None:
            nonlocal sent
            t0 = trio.current_time()
            try:
                for i, message in enumerate(messages):
                    if realtime:
                        await trio.sleep_until(t0 + i * FRAME_SECONDS)
                    else:
                        await progress.wait_until(i - max_ahead)
                    await conn.send_raw(message)
                    sent = i + 1
                await conn.commit()
            except (ServerClosed, ServerBusy):
                pass  # the receiver reports why the server closed

        failure: ClientError | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send_audio)
            try:
                while True:
                    try:
                        with trio.fail_after(event_timeout):
                            event = await conn.receive()
                    except trio.TooSlowError:
                        raise ClientError(
                            f"no event from the server for {event_timeout:g} s (sent "
                            f"{sent}/{len(messages)} appends); it never sent response.done"
                        ) from None
                    seen(event.raw)
                    index = event.raw.get("frame_index")
                    if isinstance(index, int):
                        progress.advance(index)
                    if isinstance(event, AudioDelta):
                        chunks.append(checker.check(event))
                        if first_audio is None:
                            first_audio = time.perf_counter() - started
                    elif isinstance(event, ResponseDone):
                        break
                    elif isinstance(event, ResponseCancelled):
                        raise ClientError("server cancelled the response")
                    else:
                        printer.feed(event)
            except ClientError as exc:
                failure = exc  # raised below, outside the nursery, so not as a group
            finally:
                printer.finish()
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure

    audio = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    return FileClientResult(
        pcm=audio,
        frames=checker.frames,
        session_id=updated.session_id,
        model=updated.model,
        texts=dict(printer.texts),
        frames_sent=sent,
        seconds_to_ready=ready,
        seconds_to_first_audio=first_audio,
        seconds_total=time.perf_counter() - started,
        event_counts=counts,
    )


def _seed(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("seed must be >= 0")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("expected a number >= 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="voicechat_file_client.py",
        description="Send a WAV through /v1/realtime and write the spoken answer as a WAV.",
        epilog=EXIT_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("url", metavar="URL", help="ws://HOST:PORT/v1/realtime")
    p.add_argument("input", metavar="IN.wav", type=Path)
    p.add_argument("output", metavar="OUT.wav", type=Path)
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument(
        "--extra-seconds",
        type=_non_negative,
        default=3.0,
        help="silence appended so the answer can finish (default %(default)s)",
    )
    p.add_argument(
        "--realtime", action="store_true", help="pace appends every 80 ms like a live microphone"
    )
    p.add_argument(
        "--events",
        type=Path,
        metavar="OUT.jsonl",
        default=None,
        help="write every received event as JSON lines (audio as sample counts)",
    )
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    p.add_argument("--origin", default=None, help="send this Origin header (browser-like)")
    return p


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None) -> int:
    out = stdout if stdout is not None else sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.input.is_file():
        parser.error(f"input file not found: {args.input}")
    if not args.output.parent.is_dir():
        parser.error(f"output folder does not exist: {args.output.parent}")
    try:
        audio, rate = read_wav(args.input)
    except Exception as exc:  # soundfile raises its own error types
        parser.error(f"cannot read {args.input}: {exc}")
    if audio.shape[0] == 0:  # whatever --extra-seconds adds: silence alone is no question
        parser.error(f"input audio {args.input} is empty (0 samples)")
    pcm = prepare_input(audio, rate, extra_seconds=args.extra_seconds)
    log: TextIO | None = None
    try:
        if args.events is not None:
            log = args.events.open("w", encoding="utf-8")

        def on_event(event: Event) -> None:
            if log is not None:
                log.write(json.dumps(redact_audio(event)) + "\n")

        def on_ready(updated: SessionUpdated) -> None:
            print(
                f"sending {pcm.size / INPUT_SAMPLE_RATE:.2f} s of audio "
                f"({args.extra_seconds:g} s silence appended) to {args.url}",
                file=sys.stderr,
            )

        result = trio.run(
            lambda: run_file_client(
                args.url,
                pcm,
                system_prompt=args.system_prompt,
                seed=args.seed,
                realtime=args.realtime,
                api_key=args.api_key,
                origin=args.origin,
                on_ready=on_ready,
                on_event=on_event,
                printer=TranscriptPrinter(out),
            )
        )
    except ClientError as exc:
        return report(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if log is not None:
            log.close()
    write_wav_pcm16(args.output, result.pcm, OUTPUT_SAMPLE_RATE)
    first = result.seconds_to_first_audio
    print(
        f"wrote {args.output}: {result.frames} frames, {result.audio_seconds:.2f} s at "
        f"{OUTPUT_SAMPLE_RATE} Hz; session ready in {result.seconds_to_ready:.2f} s, "
        f"first audio after {first if first is not None else float('nan'):.2f} s, "
        f"total {result.seconds_total:.2f} s (real-time factor {result.real_time_factor:.2f})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
