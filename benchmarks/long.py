"""``python -m benchmarks.long``: how a session's cost grows with its length.

Model side (no server, unpaced): one streaming session through this project's
adapter, fed ``--minutes`` of audio back to back, once without a bound and once per
``--bound`` (``max_streaming_seconds``). Per minute of conversation: the median
and p95 step time, the process RSS and MLX's active memory at the minute's end.
mlx-vlm's bound is a hard stop (``VoiceChatContextLimitError`` once the frame
index reaches it), so a bounded run reports where it stopped and then, as a
client would, opens a fresh session and carries on (``renewals``), so its ten
minutes show what a renewed session costs.

Wire side: this server with a small bound, one-frame appends past it, then a commit:
every event the client receives after the bound, in order.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trio

from benchmarks.common import model_path, write_json
from benchmarks.servers import ours, rss_bytes
from benchmarks.stats import command_line
from benchmarks.wire import BenchError, connect, figures_for, frame_messages, test_pcm
from realtime.models.base import ModelFigures, open_session


def frames_per_minute(figures: ModelFigures) -> int:
    """750 for VoiceChat's 80 ms frames."""
    return round(60 * figures.frames_per_second)


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / 1e6, 1)


def model_side(
    path: Path, minutes: float, bound: float | None, *, renew: bool = True
) -> dict[str, Any]:
    """One long session (renewed at the bound when ``renew``), stepped on this thread."""
    import os

    import mlx.core as mx

    from realtime.models.base import InferenceError
    from realtime.models.voicechat.load import load_voicechat

    model = load_voicechat(path)
    figures = model.figures
    per_minute = frames_per_minute(figures)
    size, rate = figures.frame_samples, figures.input_sample_rate
    total = max(1, round(minutes * per_minute))
    # A minute of test audio, looped: the model's caches see every frame as new input.
    audio = test_pcm(per_minute * size, seed=3).astype(np.float32) / 32768.0

    def fresh() -> Any:
        return open_session(model, system_prompt=None, seed=0, max_streaming_seconds=bound)

    session = fresh()
    steps: list[float] = []
    minutes_out: list[dict[str, Any]] = []
    stops: list[dict[str, Any]] = []
    session_frames = 0
    for i in range(total):
        offset = (i % per_minute) * size
        chunk = audio[offset : offset + size]
        started = time.perf_counter()
        try:
            session.push_audio(chunk, rate)
        except InferenceError as exc:
            again: str | None = None
            try:  # what the next push after the bound does
                session.push_audio(chunk, rate)
            except InferenceError as second:
                again = str(second)
            stops.append(
                {
                    "at_frame": i,
                    "session_frames": session_frames,
                    "error": str(exc),
                    "next_push": again,
                }
            )
            if not renew:
                break
            session.flush(False)
            model.clear_cache()
            session = fresh()
            session_frames = 0
            started = time.perf_counter()
            session.push_audio(chunk, rate)
        steps.append(time.perf_counter() - started)
        session_frames += 1
        if (i + 1) % per_minute == 0 or i + 1 == total:
            window = np.asarray(steps[-per_minute:]) * 1e3
            minutes_out.append(
                {
                    "minute": round((i + 1) / per_minute, 2),
                    "step_ms_p50": float(np.median(window)),
                    "step_ms_p95": float(np.percentile(window, 95)),
                    "rss_mb": _mb(rss_bytes(os.getpid())),
                    "mlx_active_mb": _mb(int(mx.get_active_memory())),
                    "session_frames": session_frames,
                }
            )
            last = minutes_out[-1]
            print(
                f"long: bound={bound} minute {last['minute']}: step p50 {last['step_ms_p50']:.2f}"
                f" ms, RSS {last['rss_mb']} MB, MLX active {last['mlx_active_mb']} MB",
                file=sys.stderr,
                flush=True,
            )
    session.flush(False)
    first, final = minutes_out[0], minutes_out[-1]
    return {
        "bound_seconds": bound,
        "frames": len(steps),
        "minutes": minutes_out,
        "stops": stops,
        "renewals": len(stops),
        "step_growth": final["step_ms_p50"] / first["step_ms_p50"],
        "rss_growth_mb": (final["rss_mb"] or 0.0) - (first["rss_mb"] or 0.0),
        "mlx_active_growth_mb": (final["mlx_active_mb"] or 0.0) - (first["mlx_active_mb"] or 0.0),
    }


async def _wire(url: str, bound: float, appends: int, figures: ModelFigures) -> dict[str, Any]:
    """Stream ``appends`` one-frame appends into a session bounded at ``bound`` seconds,
    then commit: every event after the first error, as types and codes."""
    from realtime.client import ServerClosed, session_update_message

    messages = frame_messages(test_pcm(appends * figures.frame_samples, seed=4), figures)
    seen: list[dict[str, Any]] = []
    audio = 0
    async with connect(url, None) as client:
        await client.send(session_update_message(max_streaming_seconds=bound))
        await client.expect("session.updated", 120)
        try:
            for message in messages:
                await client.send(message)
                await trio.sleep(0.01)
            await client.send(json.dumps({"type": "input_audio_buffer.commit"}))
        except ServerClosed:
            pass  # the server ended the session at the bound; its last events follow
        with trio.fail_after(120):
            while True:
                try:
                    _, event = await client.recv()
                except Exception:  # the server closed the connection
                    break
                kind = event.get("type")
                if kind == "response.audio.delta":
                    audio += 1
                    continue
                if kind in ("response.text.delta", "response.function.delta"):
                    continue
                if kind == "conversation.item.input_audio_transcription.delta":
                    continue
                entry = {"type": kind}
                if kind == "error":
                    entry.update(event["error"])
                if "frame_index" in event:
                    entry["frame_index"] = event["frame_index"]
                seen.append(entry)
                if kind in ("response.done", "response.cancelled"):
                    break
    errors = [e for e in seen if e["type"] == "error"]
    return {
        "bound_seconds": bound,
        "appends": appends,
        "audio_deltas": audio,
        "bound_frames": int(bound * figures.frames_per_second),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "events": seen[:6] + ([{"...": len(seen) - 8}, *seen[-2:]] if len(seen) > 8 else seen[6:]),
        "ended_with": seen[-1]["type"] if seen else None,
    }


def wire_side(path: Path, bound: float, appends: int) -> dict[str, Any]:
    figures = figures_for(path)
    with ours(path) as server:
        return trio.run(_wire, server.url, bound, appends, figures)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.long", description=__doc__)
    parser.add_argument("--model", type=Path, help="checkpoint folder (default: the demo one)")
    parser.add_argument("--size", choices=["tiny", "medium"], default="tiny")
    parser.add_argument("--minutes", type=float, default=10.0, help="audio per run (default 10)")
    parser.add_argument(
        "--bound",
        type=float,
        action="append",
        help="max_streaming_seconds of a bounded run (repeatable; default 60)",
    )
    parser.add_argument("--no-unbounded", action="store_true", help="skip the unbounded run")
    parser.add_argument("--no-wire", action="store_true", help="skip the wire check")
    parser.add_argument(
        "--wire-bound", type=float, default=2.0, help="the wire check's bound (default 2 s)"
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    path = model_path(args)
    bounds: list[float | None] = [] if args.no_unbounded else [None]
    bounds += args.bound if args.bound else [60.0]
    results: dict[str, Any] = {
        "command": command_line("benchmarks.long", argv),
        "model": str(path),
        "runs": [],
    }
    import os

    results["load_average_start"] = os.getloadavg()[0]
    for bound in bounds:
        results["runs"].append(model_side(path, args.minutes, bound))
    if not args.no_wire:
        appends = int(args.wire_bound * figures_for(path).frames_per_second) + 10
        try:
            results["wire"] = wire_side(path, args.wire_bound, appends)
        except BenchError as exc:
            results["wire"] = {"failed": str(exc)}
    results["load_average_end"] = os.getloadavg()[0]
    for run in results["runs"]:
        print(
            f"bound {run['bound_seconds']}: {run['frames']} frames, {run['renewals']} renewals; "
            f"step p50 minute 1 -> last: {run['minutes'][0]['step_ms_p50']:.2f} -> "
            f"{run['minutes'][-1]['step_ms_p50']:.2f} ms (x{run['step_growth']:.3f}); "
            f"RSS {run['minutes'][0]['rss_mb']} -> {run['minutes'][-1]['rss_mb']} MB; "
            f"MLX active {run['minutes'][0]['mlx_active_mb']} -> "
            f"{run['minutes'][-1]['mlx_active_mb']} MB"
        )
    if "wire" in results:
        print("wire:", json.dumps(results["wire"]))
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
