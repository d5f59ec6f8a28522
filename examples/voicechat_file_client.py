"""Drive a WAV file through ``/v1/realtime`` and save the spoken answer.

    python examples/voicechat_file_client.py ws://127.0.0.1:8080/v1/realtime IN.wav OUT.wav \\
        [--system-prompt TEXT] [--seed N] [--extra-seconds 3] [--realtime] \\
        [--events OUT.jsonl] [--api-key KEY] [--origin ORIGIN] [--open-timeout SECONDS] \\
        [--no-resume]

The input is prepared exactly as ``realtime generate`` prepares it (mono PCM16 at
the rate the server's ``session.updated`` names, 16 kHz for VoiceChat, plus
``--extra-seconds`` of silence so the model can finish speaking), and the audio
deltas are written unchanged, so for the same WAV, prompt and seed the output
equals ``realtime generate --stream`` byte for byte.

The protocol goes through :mod:`realtime.client`. Exit status: 0 on
``response.done``; a distinct code for each way of not getting a session (see
``--help`` and docs/client.md); 1 if the server errors, closes early or stalls, or
the session does not open within ``--open-timeout`` seconds (600 by default: the
server reads the system prompt first).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import trio

from realtime.audio import read_wav, write_wav_pcm16
from realtime.client import (
    ClientError,
    SessionUpdated,
)
from realtime.client.cli import (
    Event,
    TranscriptPrinter,
    add_connection_options,
    checked,
    client_parser,
    redact_audio,
    report,
    retrying_busy,
)
from realtime.client.files import FileClientResult, InputAudio, run_file_client
from realtime.launch.cli import add_answer_options


@checked(int, "seed must be >= 0")
def _seed(value: int) -> bool:
    return value >= 0


@checked(float, "expected a number >= 0")
def _non_negative(value: float) -> bool:
    return value >= 0 and value != float("inf")


def build_parser() -> argparse.ArgumentParser:
    p = client_parser(
        "voicechat_file_client.py",
        "Send a WAV through /v1/realtime and write the spoken answer as a WAV.",
    )
    p.add_argument("url", metavar="URL", help="ws://HOST:PORT/v1/realtime")
    p.add_argument("input", metavar="IN.wav", type=Path, help="the question (any rate)")
    p.add_argument("output", metavar="OUT.wav", type=Path, help="where the spoken answer goes")
    add_answer_options(p, seed=_seed, extra_seconds=_non_negative)  # as `realtime generate`
    p.add_argument(
        "--realtime",
        action="store_true",
        help="pace appends one model step apart (80 ms for VoiceChat), like a live microphone",
    )
    p.add_argument(
        "--events",
        type=Path,
        metavar="OUT.jsonl",
        default=None,
        help="write every received event as JSON lines (audio as sample counts)",
    )
    add_connection_options(p)
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
    source = InputAudio(audio, rate, args.extra_seconds)
    log: TextIO | None = None
    try:
        if args.events is not None:
            log = args.events.open("w", encoding="utf-8")

        def on_event(event: Event) -> None:
            if log is not None:
                log.write(json.dumps(redact_audio(event)) + "\n")

        def on_ready(updated: SessionUpdated) -> None:
            print(
                f"sending {source.seconds:.2f} s of audio "
                f"({args.extra_seconds:g} s silence appended) to {args.url}",
                file=sys.stderr,
            )

        async def attempt() -> FileClientResult:
            return await run_file_client(
                args.url,
                source,
                system_prompt=args.system_prompt,
                seed=args.seed,
                realtime=args.realtime,
                api_key=args.api_key,
                origin=args.origin,
                resume=args.resume,
                open_timeout=args.open_timeout,
                on_ready=on_ready,
                on_event=on_event,
                printer=TranscriptPrinter(out),
            )

        result = trio.run(retrying_busy, attempt, args.retry)
    except ClientError as exc:
        return report(exc)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if log is not None:
            log.close()
    write_wav_pcm16(args.output, result.pcm, result.sample_rate)
    first = result.seconds_to_first_audio
    print(
        f"wrote {args.output}: {result.frames} frames, {result.audio_seconds:.2f} s at "
        f"{result.sample_rate} Hz; session ready in {result.seconds_to_ready:.2f} s, "
        f"first audio after {first if first is not None else float('nan'):.2f} s, "
        f"total {result.seconds_total:.2f} s (real-time factor {result.real_time_factor:.2f})",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
