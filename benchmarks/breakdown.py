"""``python -m benchmarks.breakdown``: where one frame's latency goes, hop by hop.

Starts a server in a subprocess with an :class:`~realtime.observe.Observer` that
records ``perf_counter`` at each hop (no private method is patched), streams
frames one at a time (paced at the model's step, 80 ms for VoiceChat, unless
``--unpaced``), and lines the server's clock up with the client's (``perf_counter``
is CLOCK_MONOTONIC, shared by every process on Linux). The model step is this server's
engine command for the frame (its own frame step, realtime/models/voicechat/step.py;
on the zero-cost model the same) and, in mlx-vlm's server, its
``VoiceChatStreamingSession.push_audio``, so "total minus model step" is each server's
own overhead. Diagnostic only.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import logging
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
from benchmarks.wire import AUDIO_DELTA, CANCEL, connect, figures_for, frame_messages, test_pcm
from realtime.observe import CommandKind, Hop, Observer, SessionReport

SKIP: Final = 10
"""Frames left out of the figures (allocator and cache warm-up)."""
OURS_HOPS: Final = (
    ("client send -> server receive", "sent", "recv"),
    ("receive -> slice submitted (parse, queue)", "recv", "sub"),
    ("submit -> model step starts", "sub", "step0"),
    ("model step", "step0", "step1"),
    ("model step end -> collector resumes", "step1", "ret"),
    ("collector resumes -> audio send starts", "ret", "send0"),
    ("audio send (Hypercorn, socket)", "send0", "send1"),
    ("audio sent -> client has it", "send1", "got"),
)
PEER_HOPS: Final = (
    ("client send -> server receive", "sent", "recv"),
    ("receive -> model step starts (parse, threads)", "recv", "step0"),
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


def _time_mlx_vlm_step(marks: Marks) -> None:
    """Timestamps around mlx-vlm's own step, on the thread that runs it (the only
    way to time the peer server, so both servers are timed the same way)."""
    from mlx_vlm.models.nemotron_voicechat.streaming import VoiceChatStreamingSession

    clock = time.perf_counter
    push: Callable[..., Any] = VoiceChatStreamingSession.push_audio

    def timed_push(self: Any, *args: Any, **kwargs: Any) -> Any:
        marks["step0"].append(clock())
        try:
            return push(self, *args, **kwargs)
        finally:
            marks["step1"].append(clock())

    VoiceChatStreamingSession.push_audio = timed_push  # type: ignore[method-assign]


def _mark_peer_receives(marks: Marks) -> None:
    """A timestamp as each audio append reaches mlx-vlm's endpoint (Starlette's
    ``WebSocket.receive``, before its JSON is decoded): the peer's counterpart of this
    server's ``append_received``, so both servers' ways in split at the same point."""
    from starlette.websockets import WebSocket

    clock = time.perf_counter
    receive: Callable[..., Any] = WebSocket.receive

    async def timed_receive(self: Any) -> Any:
        message = await receive(self)
        text = message.get("text") if isinstance(message, dict) else None
        if text and "input_audio_buffer.append" in text:
            marks["recv"].append(clock())
        return message

    WebSocket.receive = timed_receive  # type: ignore[method-assign]


_MARKS: dict[Hop, str] = {
    "append_received": "recv",
    "slice_submitted": "sub",
    "slice_collected": "ret",
    "audio_sending": "send0",
    "audio_sent": "send1",
}


class HopMarks(Observer):
    """Records ``perf_counter`` at each hop of every audio frame; saved at session end
    (``realtime serve`` leaves through ``os._exit``, which skips atexit handlers)."""

    def __init__(self, out: Path, *, time_steps: bool) -> None:
        self.out = out
        self.time_steps = time_steps
        keys = ("recv", "sub", "ret", "send0", "send1", "step0", "step1")
        self.marks: Marks = {k: [] for k in keys}

    def command_started(self, kind: CommandKind) -> None:
        if self.time_steps and kind == "push":
            self.marks["step0"].append(time.perf_counter())

    def command_finished(self, kind: CommandKind, seconds: float) -> None:
        if self.time_steps and kind == "push":
            self.marks["step1"].append(time.perf_counter())

    def hop(self, hop: Hop, at: float) -> None:
        self.marks[_MARKS[hop]].append(at)

    def session_ended(self, report: SessionReport) -> None:
        _save(self.out, self.marks)


def _serve_ours(out: Path, what: str) -> int:
    """This server, as ``realtime serve`` builds it, plus the hop recorder."""
    from realtime.engine.facade import Engine
    from realtime.launch.server import model_loader
    from realtime.models.base import RealtimeModel
    from realtime.observe import Observers
    from realtime.telemetry.logs import SessionLog
    from realtime.telemetry.metrics import PrometheusObserver
    from realtime.testing.servers import serve_engine

    logging.basicConfig(level=logging.WARNING)
    hops = HopMarks(out, time_steps=True)
    loader: Callable[[], RealtimeModel]
    if what == "null":
        from realtime.testing.fake import NullModel

        loader = NullModel
    else:
        loader = model_loader(what, None)
    engine = Engine(loader)
    engine.start()
    metrics = PrometheusObserver()
    serve_engine(engine, metrics=metrics, observer=Observers((metrics, SessionLog(), hops)))
    return 0


def _serve(argv: list[str]) -> int:
    """The instrumented server: ``serve OUT (ours|peer) (null|PATH) [PORT]``."""
    out, which, what = Path(argv[0]), argv[1], argv[2]
    if which == "peer":
        marks: Marks = {"recv": [], "step0": [], "step1": []}
        _time_mlx_vlm_step(marks)
        _mark_peer_receives(marks)
        atexit.register(_save, out, marks)
        peer_main: Callable[[], None] = importlib.import_module("mlx_vlm.server.cli").main
        sys.argv = ["mlx_vlm.server", "--host", "127.0.0.1", "--port", argv[3]]
        sys.argv += ["--log-level", "WARNING"]
        peer_main()
        return 0
    return _serve_ours(out, what)


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
    figures = figures_for(model)
    messages = frame_messages(test_pcm(frames * figures.frame_samples, seed=1), figures)
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
                step = c.conn.frame_seconds
                start = trio.current_time()
                for i, message in enumerate(messages):
                    if paced:
                        await trio.sleep_until(start + i * step)
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
    parser.add_argument(
        "--size", choices=["tiny", "medium"], default="tiny", help="demo checkpoint preset"
    )
    parser.add_argument("--null", action="store_true", help="the zero-cost model instead")
    parser.add_argument("--peer", action="store_true", help="mlx-vlm's server instead of ours")
    parser.add_argument("--frames", type=int, default=100)
    parser.add_argument("--unpaced", action="store_true", help="no pacing at the model's step")
    args = parser.parse_args(argv)
    model: Path | None = None
    if not args.null:
        from realtime.demo.checkpoint import SIZES, ensure_demo_checkpoint

        model = (args.model or ensure_demo_checkpoint(size=SIZES[args.size])).resolve()
    elif args.peer:
        parser.error("--null is this server's zero-cost model; mlx-vlm cannot serve it")
    result = breakdown(model, args.frames + SKIP, paced=not args.unpaced, peer=args.peer)
    print_breakdown(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
