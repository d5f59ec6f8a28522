"""Test helpers: servers on 127.0.0.1 (in-process or as a subprocess) and a JSON client."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from realtime.app import ServerState
from realtime.engine import Engine
from realtime.limits import Limits
from realtime.server import hypercorn_config, run_server

REPO = Path(__file__).resolve().parent.parent
SERVING_LINE = re.compile(r"realtime: serving (ws://\S+/v1/realtime)")


@attrs.frozen
class Server:
    http: str
    url: str
    state: ServerState


@asynccontextmanager
async def running_server(
    engine: Engine,
    *,
    limits: Limits | None = None,
    api_key: str | None = None,
    allowed_origins: Sequence[str] = (),
) -> AsyncIterator[Server]:
    """The real app on Hypercorn on 127.0.0.1 (free port), in this trio run."""
    limits = limits or Limits()
    state = ServerState(
        engine=engine, limits=limits, api_key=api_key, allowed_origins=tuple(allowed_origins)
    )
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(
                run_server,
                state,
                hypercorn_config("127.0.0.1", 0, limits),
                shutdown_trigger=stop.wait,
            )
        )
        http = binds[0]
        yield Server(http=http, url=http.replace("http://", "ws://") + "/v1/realtime", state=state)
        stop.set()


def pcm16_b64(samples: np.ndarray[Any, Any]) -> str:
    x = np.clip(np.asarray(samples, dtype=np.float32), -1, 1)
    return base64.b64encode(np.rint(x * 32767).astype("<i2").tobytes()).decode()


def append_msg(samples: np.ndarray[Any, Any], sample_rate: int = 16000) -> str:
    return json.dumps(
        {
            "type": "input_audio_buffer.append",
            "audio": pcm16_b64(samples),
            "sample_rate": sample_rate,
        }
    )


def noise(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return (np.random.default_rng(seed).standard_normal(n) * 0.1).astype(np.float32)


class Client:
    """A thin JSON layer over a trio-websocket connection."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws

    async def send(self, message: dict[str, Any] | str) -> None:
        await self.ws.send_message(message if isinstance(message, str) else json.dumps(message))

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            event: dict[str, Any] = json.loads(await self.ws.get_message())
            return event

    async def recv_until(self, type_: str, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Every event up to and including the first of ``type_``."""
        events = []
        with trio.fail_after(timeout):
            while True:
                event = await self.recv(timeout)
                events.append(event)
                if event["type"] == type_:
                    return events

    async def configure(self, **session: Any) -> dict[str, Any]:
        created = await self.recv()
        assert created["type"] == "session.created", created
        await self.send({"type": "session.update", "session": session})
        updated = await self.recv()
        assert updated["type"] == "session.updated", updated
        return updated

    async def closed_code(self, timeout: float = 10.0) -> int | None:
        """Drain until the server closes; the close code."""
        from trio_websocket import ConnectionClosed

        with trio.fail_after(timeout):
            try:
                while True:
                    await self.ws.get_message()
            except ConnectionClosed as exc:
                return exc.reason.code if exc.reason is not None else None


@asynccontextmanager
async def connect(url: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with open_websocket_url(url, **kwargs) as ws:
        yield Client(ws)


@attrs.frozen
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    http: str
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def start_realtime_server(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    log_dir: Path | None = None,
    argv: Sequence[str] | None = None,
) -> Iterator[ServerProcess]:
    """``python -m realtime serve --port 0 ARGS`` as a subprocess; waits for its URL."""
    log_dir = log_dir or Path(os.environ.get("TMPDIR", "/tmp"))
    log = log_dir / f"realtime-server-{os.getpid()}-{time.monotonic_ns()}.log"
    cmd = (
        list(argv)
        if argv is not None
        else [sys.executable, "-m", "realtime", "serve", "--port", "0", *args]
    )
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            cmd, stdout=sink, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})}
        )
    try:
        deadline = time.monotonic() + timeout
        while True:
            text = log.read_text(errors="replace")
            match = SERVING_LINE.search(text)
            if match:
                url = match.group(1)
                break
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}:\n{text}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server did not start in {timeout} s:\n{text}")
            time.sleep(0.05)
        http = url.replace("ws://", "http://").removesuffix("/v1/realtime")
        yield ServerProcess(proc=proc, url=url, http=http, log=log)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
