"""Test helpers: engines, servers on 127.0.0.1 (in-process or as a subprocess) and a JSON
client."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import trio
from trio_websocket import WebSocketConnection, open_websocket_url

from realtime.client import (
    RealtimeClient,
    ServerBusy,
    ServerClosed,
    encode_pcm16,
)
from realtime.engine.facade import Engine
from realtime.http.app import ServerState
from realtime.launch.server import hypercorn_config, run_server
from realtime.limits import Limits
from realtime.models.base import RealtimeModel
from realtime.observe import Observer
from realtime.tenants import Tenants
from realtime.testing.servers import ServerProcess as ServerProcess
from realtime.testing.servers import start_server_process

REPO = Path(__file__).resolve().parent.parent


@contextmanager
def running_engine(
    model: RealtimeModel,
    *,
    capacity: int = 1,
    observer: Observer | None = None,
    admission_margin: float = 0.0,
) -> Iterator[Engine]:
    """An engine serving ``model`` for the block, shut down after it (also when it
    fails), so a test's engine thread never outlives the test."""
    engine = Engine(
        lambda: model, capacity=capacity, observer=observer, admission_margin=admission_margin
    )
    engine.start()
    try:
        yield engine
    finally:
        engine.shutdown()


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
    tenants: Tenants | None = None,
    replica_id: str | None = None,
) -> AsyncIterator[Server]:
    """The real app on Hypercorn on 127.0.0.1 (free port), in this trio run
    (``tenants``: several keys, as ``--api-keys-file`` gives them; ``replica_id``: as
    ``--replica-id`` names a replica behind a balancer)."""
    limits = limits or Limits()
    state = ServerState(
        engine=engine,
        limits=limits,
        api_key=api_key,
        allowed_origins=tuple(allowed_origins),
        tenants=tenants,
        replica_id=replica_id,
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
    """Float samples as the wire's base64 PCM16."""
    return encode_pcm16(np.asarray(samples, dtype=np.float32))


def append_msg(samples: np.ndarray[Any, Any], sample_rate: int = 16000) -> str:
    audio = pcm16_b64(samples)
    return json.dumps(
        {"type": "input_audio_buffer.append", "audio": audio, "sample_rate": sample_rate}
    )


def noise(n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    return (np.random.default_rng(seed).standard_normal(n) * 0.1).astype(np.float32)


class Client:
    """Raw JSON events over :class:`realtime.client.RealtimeClient` (errors returned,
    not raised), so tests can send anything and see everything."""

    def __init__(self, ws: WebSocketConnection) -> None:
        self.ws = ws
        self.conn = RealtimeClient(ws, raise_errors=False)

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        await self.conn.send_raw(
            message if isinstance(message, str | bytes) else json.dumps(message)
        )

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        with trio.fail_after(timeout):
            return (await self.conn.receive()).raw

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
        with trio.fail_after(timeout):
            try:
                while True:
                    await self.conn.receive()
            except (ServerClosed, ServerBusy):
                return self.conn.close_code


@asynccontextmanager
async def connect(url: str, **kwargs: Any) -> AsyncIterator[Client]:
    async with open_websocket_url(url, **kwargs) as ws:
        yield Client(ws)


@contextmanager
def start_realtime_server(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 180.0,
    log_dir: Path | None = None,
    argv: Sequence[str] | None = None,
) -> Iterator[ServerProcess]:
    """``python -m realtime serve --port 0 ARGS`` as a subprocess; waits for its URL."""
    with start_server_process(
        *args, argv=argv, env=env, timeout=timeout, log_dir=log_dir, cwd=REPO
    ) as server:
        yield server


# --- plain HTTP ---------------------------------------------------------------------


def http(
    method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


async def ahttp(
    method: str, url: str, headers: dict[str, str] | None = None, body: bytes | None = None
) -> tuple[int, Any]:
    return await trio.to_thread.run_sync(http, method, url, headers, body)


@contextmanager
def start_hypercorn_cli(
    env: dict[str, str], log_dir: Path, timeout: float = 180.0
) -> Iterator[ServerProcess]:
    """``hypercorn -k trio realtime.launch.asgi:app`` on a free port, once ``/health`` answers
    (with ``REALTIME_API_KEY`` from ``env`` if set). SIGINT on the way out."""
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "hypercorn", "-k", "trio", "--bind", f"127.0.0.1:{port}"]
    log = log_dir / "hypercorn.log"
    headers = (
        {"Authorization": f"Bearer {env['REALTIME_API_KEY']}"} if "REALTIME_API_KEY" in env else {}
    )
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [*argv, "realtime.launch.asgi:app"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=REPO,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                status, _ = http("GET", base + "/health", headers=headers)
                if status == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(log.read_text(errors="replace"))
            time.sleep(0.1)
        url = f"ws://127.0.0.1:{port}/v1/realtime"
        yield ServerProcess(proc=proc, url=url, http=base, log=log, name="hypercorn")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run_python_module(
    module: str, *args: str, path: Sequence[Path] = (), timeout: float = 300
) -> list[str]:
    """``python -m module ARGS...`` in a process of its own, from the repository, with
    ``path`` first on its import path (another package version, a dependency kept
    apart); its stdout lines. Fails the test, with the end of its stderr, unless it
    exits 0."""
    import os

    from tests.models_fixtures import run_python

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*map(str, path), str(REPO)])}
    done = run_python("-m", module, *args, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()
