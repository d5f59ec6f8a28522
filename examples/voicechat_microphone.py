"""Talk to the model live: microphone in, speaker out, text printed as it arrives.

    python examples/voicechat_microphone.py ws://127.0.0.1:8080/v1/realtime \\
        [--system-prompt TEXT] [--seed N] [--api-key KEY] [--origin ORIGIN] \\
        [--input-device NAME] [--output-device NAME]
    python examples/voicechat_microphone.py --list-devices

The first Ctrl-C sends ``input_audio_buffer.commit`` and waits for
``response.done`` and for the speaker to play what is buffered; a second Ctrl-C
quits at once. The speaker's echo is taken out of the microphone
(``realtime.client.echo``, when LiveKit's SDK is installed: ``realtime[clients]``),
so speakers work; ``--no-echo-cancellation`` turns it off (then use headphones).

The session, the devices and the echo canceller are the client library's
(:mod:`realtime.client.live`, ``devices``, ``echo``; docs/client.md): this is their
command line. Failing to get a session exits with the code ``--help`` lists for it.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from typing import Any

import trio

from realtime.client import (
    ClientError,
    check_url,
)
from realtime.client.cli import (
    EXIT_USAGE,
    add_connection_options,
    checked,
    client_parser,
    report,
    retrying_busy,
)
from realtime.client.devices import (
    AudioInput,
    AudioOutput,
    AudioUnavailable,
    device_arg,
    list_devices,
    load_sounddevice,
)
from realtime.client.live import (
    Interrupted,
    MicrophoneResult,
    open_sound_devices,
    run_microphone_client,
)


async def _forward_signals(signals: Any, send: trio.MemorySendChannel[None]) -> None:
    """SIGINT -> an item on the interrupt channel (so Ctrl-C commits, not crashes)."""
    async for _ in signals:
        send.send_nowait(None)


@checked(int, "expected a sample rate in Hz (8000..384000)")
def _rate(value: int) -> bool:
    return 8000 <= value <= 384_000


def build_parser() -> argparse.ArgumentParser:
    p = client_parser(
        "voicechat_microphone.py",
        "Live conversation over /v1/realtime: microphone in, speaker out.",
    )
    p.add_argument("url", metavar="URL", nargs="?", help="ws://HOST:PORT/v1/realtime")
    p.add_argument(
        "--system-prompt",
        default=None,
        metavar="TEXT",
        help="the model's instructions for this session (default: the server's)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="the session's random seed: the same seed and audio give the same answer (default 0)",
    )
    add_connection_options(p)
    p.add_argument("--input-device", default=None, metavar="NAME|INDEX", help="see --list-devices")
    p.add_argument("--output-device", default=None, metavar="NAME|INDEX", help="see --list-devices")
    p.add_argument(
        "--input-rate",
        type=_rate,
        default=None,
        metavar="HZ",
        help="capture rate (default: 16000 when the device takes it, else its own)",
    )
    p.add_argument(
        "--output-rate",
        type=_rate,
        default=None,
        metavar="HZ",
        help="playback rate (default: 22050 when the device takes it, else its own)",
    )
    p.add_argument(
        "--meter",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a live level/latency line (default: on when stderr is a terminal)",
    )
    p.add_argument(
        "--echo-cancellation",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="take the speaker's echo out of the microphone (WebRTC's canceller, from "
        "LiveKit's SDK in realtime[clients]), so the model does not hear itself "
        "(default: on when installed; --no-echo-cancellation: use headphones)",
    )
    p.add_argument(
        "--noise-suppression",
        action="store_true",
        help="with echo cancellation: also suppress steady background noise",
    )
    p.add_argument("--list-devices", action="store_true", help="list audio devices and exit")
    return p


async def _session(
    args: argparse.Namespace, source: AudioInput, sink: AudioOutput, meter: bool
) -> MicrophoneResult:
    """The live session with SIGINT forwarded to it as interrupts."""
    send, recv = trio.open_memory_channel[None](math.inf)
    failure: Exception | None = None
    result: MicrophoneResult | None = None
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_forward_signals, signals, send)
            try:
                result = await run_microphone_client(
                    args.url,
                    source,
                    sink,
                    recv,
                    system_prompt=args.system_prompt,
                    seed=args.seed,
                    api_key=args.api_key,
                    origin=args.origin,
                    resume=args.resume,
                    open_timeout=args.open_timeout,
                    meter=meter,
                    echo_cancelled=getattr(source, "echo", None) is not None,
                )
            except (ClientError, Interrupted) as exc:
                failure = exc  # re-raised outside the nursery: no ExceptionGroup
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    assert result is not None
    return result


def _exit(code: int, abandoned_device_calls: int) -> int:
    if abandoned_device_calls:
        # A device call is still blocked inside PortAudio: its atexit teardown
        # (Pa_Terminate) could block as well, so leave without it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.list_devices and not args.url:
        parser.error("URL is required (or --list-devices)")
    if args.seed < 0:
        parser.error("--seed must be >= 0")
    if args.url:
        try:
            check_url(args.url)  # before any audio device is opened
        except ClientError as exc:
            return report(exc)
    try:
        if args.list_devices:
            list_devices(load_sounddevice(), sys.stdout)
            return 0
        source, sink = open_sound_devices(
            device_arg(args.input_device),
            device_arg(args.output_device),
            args.input_rate,
            args.output_rate,
            echo_cancellation=args.echo_cancellation,
            noise_suppression=args.noise_suppression,
        )
    except AudioUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    meter = args.meter if args.meter is not None else sys.stderr.isatty()
    try:
        result = trio.run(retrying_busy, partial(_session, args, source, sink, meter), args.retry)
    except Interrupted:
        print("\nquit", file=sys.stderr)
        return 130
    except ClientError as exc:
        return report(exc)
    except KeyboardInterrupt:
        return 130
    print(result.summary(sink.sample_rate), file=sys.stderr, flush=True)
    return _exit(0 if result.done else 1, result.abandoned_device_calls)


if __name__ == "__main__":
    sys.exit(main())
