"""``realtime generate``: run a WAV through the model without a server.

With ``--stream`` it feeds the very adapter session the server uses, in the
server's slices (the model's ``figures.frame_samples``), from the same input
preparation, so its output WAV
equals (byte for byte) the audio a file client receives over ``/v1/realtime``
for the same input, prompt, seed and extra seconds. Without ``--stream`` it uses
mlx-vlm's offline path. There is no engine here, so MLX runs on the main thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import numpy as np

from realtime.audio import (
    PCM16,
    float_to_pcm16,
    pcm16_to_float,
    prepare_input,
    read_wav,
    write_wav_pcm16,
)
from realtime.errors import UsageError
from realtime.models.base import (
    VOICECHAT_FIGURES,
    AssistantTextDelta,
    AudioDelta,
    FunctionDelta,
    InferenceError,
    ModelEvent,
    ModelSession,
    RealtimeModel,
    Samples,
    SessionInitializationError,
    UserTranscriptDelta,
    open_now,
    open_session,
    step_one,
)
from realtime.transcript import TranscriptPrinter


def stream_slices(
    samples: Samples, frame_samples: int = VOICECHAT_FIGURES.frame_samples
) -> Iterator[Samples]:
    """The input in the server's slices of ``frame_samples`` (the model's figure; the
    last slice may be short)."""
    for start in range(0, samples.shape[0], frame_samples):
        yield samples[start : start + frame_samples]


def read_source(path: str | Path) -> tuple[Samples, int]:
    """The input file as read (samples, rate); a UsageError names what is wrong with it.
    Read before the model loads, so a bad input fails at once."""
    source = Path(path)
    if not source.is_file():
        raise UsageError(f"input file {source} does not exist or is not a file")
    try:
        audio, rate = read_wav(source)
    except Exception as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        raise UsageError(f"cannot read input audio {source}: {message}") from None
    if audio.shape[0] == 0:  # whatever --extra-seconds adds: silence alone is no input
        raise UsageError(f"input audio {source} is empty (0 samples)")
    return audio, rate


def model_input(source: tuple[Samples, int], extra_seconds: float, to_rate: int) -> Samples:
    """The float32 samples the model is fed at ``to_rate`` (its input rate): PCM16
    decoded ``/ 32768`` as on the wire."""
    audio, rate = source
    pcm: PCM16 = prepare_input(audio, rate, extra_seconds=extra_seconds, to_rate=to_rate)
    return pcm16_to_float(pcm)


def _resolve_model(model: str | None) -> Path:
    from realtime.models import check_model_path
    from realtime.models.hub import resolve_model

    if model is None:
        from realtime.demo.checkpoint import ensure_demo_checkpoint

        path = ensure_demo_checkpoint()
        print(
            f"realtime: no -m given, using the random-weight demo checkpoint {path}",
            file=sys.stderr,
        )
        return path
    return check_model_path(resolve_model(model)).path  # ModelPathError: one line, exit 2


def _wants_demo_turns(args: argparse.Namespace) -> bool:
    """Whether the demo runs with its scripted turns (:mod:`realtime.demo.turns`): with
    no -m and --stream, as ``realtime serve`` serves it, so the output equals the
    socket's; never for a real checkpoint, nor mlx-vlm's offline path (no turns)."""
    choice: bool | None = getattr(args, "demo_turns", None)
    if args.model is not None:
        if choice is not None:
            raise UsageError("--[no-]demo-turns applies to the demo model only (omit -m)")
        return False
    if not args.stream:
        if choice:
            print("realtime: --demo-turns applies to --stream only; ignored", file=sys.stderr)
        return False
    if choice is False:
        return False
    if args.profile:
        print(
            "realtime: --profile times the raw network only: add --no-demo-turns; ignored",
            file=sys.stderr,
        )
    return True


def _label(event: ModelEvent) -> tuple[str, str] | None:
    """The transcript channel and text of a text event (None for audio and the rest)."""
    if isinstance(event, UserTranscriptDelta):
        return "user", event.delta
    if isinstance(event, AssistantTextDelta):
        return "assistant", event.delta
    if isinstance(event, FunctionDelta):
        return "function", event.delta
    return None


def _print_profile(summary: dict[str, object], out: TextIO) -> None:
    stages = summary.get("stages")
    rtf = summary.get("realtime_factor")
    print(
        f"profile: {summary.get('frames')} frames "
        f"(first {summary.get('dropped_cold_frames')} dropped), "
        f"realtime factor {float(rtf) if isinstance(rtf, (int, float)) else 0.0:.3f}",
        file=out,
    )
    if isinstance(stages, dict):
        print(f"  {'stage':<11} {'mean':>8} {'p50':>8} {'p95':>8} {'max':>8}  (ms)", file=out)
        for stage, stats in stages.items():
            print(
                f"  {stage:<11} {stats['mean_ms']:8.2f} {stats['p50_ms']:8.2f} "
                f"{stats['p95_ms']:8.2f} {stats['max_ms']:8.2f}",
                file=out,
            )
    out.flush()


def _open_stream(model: RealtimeModel, args: argparse.Namespace) -> ModelSession:
    """The streaming session; VoiceChat's profiles its frames with ``--profile``."""
    from realtime.models.voicechat.model import VoiceChatModel

    prompt, seed, bound = args.system_prompt, args.seed, args.max_seconds
    try:
        if isinstance(model, VoiceChatModel):
            opening = model.begin_session(
                system_prompt=prompt,
                seed=seed,
                max_streaming_seconds=bound,
                profile=bool(args.profile),
            )
            return open_now(opening)
        return open_session(model, system_prompt=prompt, seed=seed, max_streaming_seconds=bound)
    except SessionInitializationError as exc:
        raise UsageError(f"cannot open a session: {exc}") from None


def stream_session(
    model: RealtimeModel, session: ModelSession, samples: Samples, out: TextIO
) -> tuple[list[Samples], int]:
    """Push ``samples`` in the server's slices at the model's input rate, through the
    model's own step (``RealtimeModel.step``, what the engine runs), then flush;
    print the text channels to ``out``. The audio frames, and 1 after an inference
    error (the rest of the input is not run; what came before is kept)."""
    figures = model.figures
    audio: list[Samples] = []
    status = 0
    printer = TranscriptPrinter(out)

    def emit(events: list[ModelEvent]) -> None:
        for event in events:
            if isinstance(event, AudioDelta):
                audio.append(event.samples)
                continue
            labelled = _label(event)
            if labelled is not None:
                printer.write(*labelled)

    for piece in stream_slices(samples, figures.frame_samples):
        try:
            emit(step_one(model, (session, piece, figures.input_sample_rate)))
        except InferenceError as exc:
            printer.break_line()
            print(f"realtime: inference error: {exc}", file=sys.stderr, flush=True)
            status = 1
            break
    emit(session.flush(pad_partial=True))
    printer.finish()
    return audio, status


def _run_stream(
    model: RealtimeModel, samples: Samples, args: argparse.Namespace
) -> tuple[list[Samples], int]:
    from realtime.models.voicechat.reference import ReferenceSession

    session = _open_stream(model, args)
    audio, status = stream_session(model, session, samples, sys.stdout)
    if args.profile and isinstance(session, ReferenceSession):
        _print_profile(session.profile_summary(), sys.stdout)
    return audio, status


def generate_command(args: argparse.Namespace) -> int:
    """``realtime generate -m PATH --input IN.wav --output OUT.wav [--stream] ...``."""
    from realtime.models import load_model

    output = Path(args.output)
    if output.exists() and output.is_dir():
        raise UsageError(f"output {output} is a directory")
    if not output.parent.exists():
        raise UsageError(f"output folder {output.parent} does not exist")
    source = read_source(args.input)
    path = _resolve_model(args.model)
    turns = _wants_demo_turns(args)
    if args.profile and not args.stream:
        print("realtime: --profile applies to --stream only; ignored", file=sys.stderr)

    started = time.perf_counter()
    model = load_model(path)  # ModelPathError, ModelLoadError: one line, exit 2
    if turns:
        from realtime.demo.turns import demo_turns

        model = demo_turns(model)
    loaded = time.perf_counter()
    figures = model.figures
    samples = model_input(source, args.extra_seconds, figures.input_sample_rate)
    computing = time.perf_counter()

    status = 0
    if args.stream:
        chunks, status = _run_stream(model, samples, args)
        out = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.float32)
        output_rate = figures.output_sample_rate
    else:
        from realtime.models.voicechat.model import VoiceChatModel

        assert isinstance(model, VoiceChatModel)
        try:
            result = model.generate_offline(
                samples,
                system_prompt=args.system_prompt,
                seed=args.seed,
                max_seconds=args.max_seconds,
            )
        except (InferenceError, SessionInitializationError) as exc:
            raise UsageError(f"generation failed: {exc}") from None
        out = result.samples
        output_rate = result.sample_rate
        printer = TranscriptPrinter(sys.stdout)
        printer.write("user", result.transcript)
        printer.write("assistant", result.text)
        printer.write("function", result.function_text)
        printer.finish()
    finished = time.perf_counter()

    try:
        write_wav_pcm16(output, float_to_pcm16(out), output_rate)
    except Exception as exc:
        raise UsageError(f"cannot write {output}: {' '.join(str(exc).split())}") from None
    input_seconds = samples.shape[0] / figures.input_sample_rate
    compute = finished - computing
    summary = {
        "output": str(output),
        "output_seconds": round(out.shape[0] / output_rate, 3),
        "input_seconds": round(input_seconds, 3),
        "load_seconds": round(loaded - started, 3),
        "compute_seconds": round(compute, 3),
        "realtime_factor": round(compute / input_seconds, 3) if input_seconds else None,
    }
    print(f"realtime: wrote {json.dumps(summary)}", file=sys.stderr, flush=True)
    return status
