"""``python -m benchmarks.breakdown``: where one frame's latency goes, hop by hop.

Starts a server in a subprocess with timestamps patched around its hops,
streams frames one at a time (paced at 80 ms unless ``--unpaced``), and lines
the server's clock up with the client's (``perf_counter`` is CLOCK_MONOTONIC,
shared by every process on Linux). The model step is timed around mlx-vlm's
own ``VoiceChatStreamingSession.push_audio`` in both servers, so "total minus
model step" is each server's own overhead, measured the same way. Diagnostic
only: each patch adds about a microsecond.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import numpy as np
import trio

from benchmarks import servers
from benchmarks.wire import AUDIO_DELTA, CANCEL, FRAME_SECONDS, connect, frame_messages, test_pcm

SKIP: Final = 10
"""Frames left out of the figures (allocator and cache warm-up)."""
OURS_HOPS: Final = (
    ("client send -> server receive", "sent", "recv"),
    ("receive -> processor (parse, queue)", "recv", "proc"),
    ("processor -> engine submit", "proc", "sub"),
    ("submit -> model step starts", "sub", "step0"),
    ("model step (mlx-vlm push_audio)", "step0", "step1"),
    ("model step end -> trio resumes", "step1", "ret"),
    ("trio resumes -> audio send starts", "ret", "send0"),
    ("audio send (Quart, Hypercorn, socket)", "send0", "send1"),
    ("audio sent -> client has it", "send1", "got"),
)
PEER_HOPS: Final = (
    ("client send -> model step starts", "sent", "step0"),
    ("model step (mlx-vlm push_audio)", "step0", "step1"),
    ("model step end -> client has audio", "step1", "got"),
)
TOTAL: Final = "total"
OVERHEAD: Final = "total minus model step"

Marks = dict[str, list[float]]
_SERVER_MAIN: list[str] = ["-m", "benchmarks.breakdown"]
"""How the instrumented server is started (a diagnostic may point it at a variant)."""


def _save(out: Path, marks: Marks) -> None:
    out.write_text(json.dumps(marks))


def _time_model_step(marks: Marks, null: bool) -> None:
    """Timestamps around the model's own step, on the thread that runs it."""
    clock = time.perf_counter
    target: Any
    if null:
        from benchmarks.null_model import NullSession

        target = NullSession
    else:
        from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

        target = VoiceChatStreamingSession
    push: Callable[..., Any] = target.push_audio

    def timed_push(self: Any, *args: Any, **kwargs: Any) -> Any:
        marks["step0"].append(clock())
        try:
            return push(self, *args, **kwargs)
        finally:
            marks["step1"].append(clock())

    target.push_audio = timed_push


def _instrument_ours(out: Path, null: bool) -> None:
    """Patch this server's hops to record ``perf_counter`` per audio frame."""
    from realtime import app, connection, engine

    marks: Marks = {k: [] for k in ("recv", "proc", "sub", "ret", "send0", "send1")}
    marks |= {"step0": [], "step1": []}
    _time_model_step(marks, null)
    clock = time.perf_counter
    receive, send = app.ASGITransport.receive, app.ASGITransport.send
    run_appends, submit, wait = (
        connection.Connection._run_appends,
        engine.Engine.submit,
        engine.Engine.wait,
    )
    run = connection.Connection.run
    pushes: set[int] = set()

    async def timed_receive(self: app.ASGITransport) -> str | bytes | None:
        data = await receive(self)
        if isinstance(data, str) and "input_audio_buffer.append" in data[:64]:
            marks["recv"].append(clock())
        return data

    async def timed_send(self: app.ASGITransport, text: str) -> None:
        audio = AUDIO_DELTA in text[:64]
        if audio:
            marks["send0"].append(clock())
        await send(self, text)
        if audio:
            marks["send1"].append(clock())

    async def timed_run_appends(self: connection.Connection, append: Any) -> None:
        marks["proc"].append(clock())
        await run_appends(self, append)

    def timed_submit(self: engine.Engine, kind: str, session_id: str, *args: Any) -> Any:
        if kind == "push":
            marks["sub"].append(clock())
        future = submit(self, kind, session_id, *args)
        if kind == "push":
            pushes.add(id(future))
        return future

    async def timed_wait(self: engine.Engine, future: Any) -> Any:
        result = await wait(self, future)
        if id(future) in pushes:
            pushes.discard(id(future))
            marks["ret"].append(clock())
        return result

    async def run_and_save(self: connection.Connection) -> None:
        # Saved as each connection ends: ``realtime serve`` leaves through
        # os._exit, which skips atexit handlers.
        try:
            await run(self)
        finally:
            _save(out, marks)

    app.ASGITransport.receive = timed_receive  # type: ignore[method-assign]
    app.ASGITransport.send = timed_send  # type: ignore[method-assign]
    connection.Connection._run_appends = timed_run_appends  # type: ignore[method-assign]
    connection.Connection.run = run_and_save  # type: ignore[method-assign]
    engine.Engine.submit = timed_submit  # type: ignore[method-assign]
    engine.Engine.wait = timed_wait  # type: ignore[method-assign]


def _serve(argv: list[str]) -> int:
    """The instrumented server: ``serve OUT (ours|peer) (null|PATH) [PORT]``."""
    out, which, what = Path(argv[0]), argv[1], argv[2]
    if which == "peer":
        marks: Marks = {"step0": [], "step1": []}
        _time_model_step(marks, null=False)
        atexit.register(_save, out, marks)
        peer_main: Callable[[], None] = importlib.import_module("mlx_vlm.server.cli").main
        sys.argv = ["mlx_vlm.server", "--host", "127.0.0.1", "--port", argv[3]]
        sys.argv += ["--log-level", "WARNING"]
        peer_main()
        return 0
    _instrument_ours(out, null=what == "null")
    if what == "null":
        from benchmarks import null_server

        return null_server.main([])
    from realtime.cli import main

    return main(["serve", "-m", what, "--host", "127.0.0.1", "--port", "0"])


def breakdown(
    model: Path | None, frames: int, *, paced: bool = True, peer: bool = False
) -> dict[str, dict[str, float]]:
    """Per-hop p50/p95 in microseconds over ``frames`` one-at-a-time frames."""
    fd, name = tempfile.mkstemp(prefix="bench-marks-", suffix=".json")
    os.close(fd)
    marks_file = Path(name)
    what = "null" if model is None else str(model)
    cmd = [sys.executable, *_SERVER_MAIN, "serve", str(marks_file)]
    port = servers.free_port()
    cmd += ["peer", what, str(port)] if peer else ["ours", what]
    messages = frame_messages(test_pcm(frames * 1280, seed=1))
    client: Marks = {"sent": [], "got": []}
    with servers.launch("breakdown", cmd, {}) as (proc, log):
        if peer:
            http = f"http://127.0.0.1:{port}"
            servers.wait_for_health(proc, log, http)
            url = f"ws://127.0.0.1:{port}/v1/realtime"
        else:
            url = servers.wait_for_serving_line(proc, log)

        async def stream() -> None:
            async with connect(url, what if peer else None) as c:
                await c.configure()
                start = trio.current_time()
                for i, message in enumerate(messages):
                    if paced:
                        await trio.sleep_until(start + i * FRAME_SECONDS)
                    client["sent"].append(await c.send(message))
                    while True:
                        at, event = await c.recv()
                        if event["type"] == AUDIO_DELTA:
                            client["got"].append(at)
                            break
                await c.send(CANCEL)
                await c.drain_until("response.cancelled", 30)

        trio.run(stream)
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    marks = {**json.loads(marks_file.read_text()), **client}
    marks_file.unlink()
    series = {k: np.asarray(v[SKIP:frames], dtype=np.float64) for k, v in marks.items()}
    out: dict[str, dict[str, float]] = {}

    def put(label: str, values: Any) -> None:
        us = np.asarray(values) * 1e6
        out[label] = {"p50": float(np.median(us)), "p95": float(np.percentile(us, 95))}

    for label, start, end in PEER_HOPS if peer else OURS_HOPS:
        put(label, series[end] - series[start])
    put(TOTAL, series["got"] - series["sent"])
    put(OVERHEAD, series["got"] - series["sent"] - (series["step1"] - series["step0"]))
    return out


def print_breakdown(result: dict[str, dict[str, float]]) -> None:
    print(f"{'hop':40s} {'p50 us':>10s} {'p95 us':>10s}")
    for label, figures in result.items():
        print(f"{label:40s} {figures['p50']:10.0f} {figures['p95']:10.0f}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m benchmarks.breakdown", description=__doc__)
    parser.add_argument("--model", type=Path, help="checkpoint (default: the demo checkpoint)")
    parser.add_argument("--null", action="store_true", help="the zero-cost model instead")
    parser.add_argument("--peer", action="store_true", help="mlx-vlm's server instead of ours")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--unpaced", action="store_true", help="no 80 ms pacing")
    args = parser.parse_args(argv)
    model: Path | None = None
    if not args.null:
        from realtime.demo_checkpoint import ensure_demo_checkpoint

        model = (args.model or ensure_demo_checkpoint()).resolve()
    elif args.peer:
        parser.error("--null is this server's zero-cost model; mlx-vlm cannot serve it")
    result = breakdown(model, args.frames + SKIP, paced=not args.unpaced, peer=args.peer)
    print_breakdown(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
