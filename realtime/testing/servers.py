"""A server in a subprocess, for tests and benchmarks: start it, learn its URL, stop it.

A subprocess keeps the client's Python (and GIL) out of the server's, gives the
benchmarks a process whose RSS and CPU time they can read, and runs the real
``realtime serve`` command line (signals, logging, exit code) as users do.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import attrs
import trio

from realtime.engine.facade import Engine
from realtime.http.app import ServerState
from realtime.launch.server import hypercorn_config, run_server
from realtime.limits import Limits
from realtime.observe import Observer
from realtime.telemetry.metrics import PrometheusObserver

SERVING_LINE: Final = re.compile(r"realtime: serving (ws://\S+/v1/realtime)")
"""What ``realtime serve`` prints once it listens (with the real port for ``--port 0``)."""
TAIL_CHARS: Final = 4000


@attrs.frozen
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    """The ``ws://.../v1/realtime`` URL."""
    http: str
    """The same server's ``http://HOST:PORT``."""
    log: Path
    """stdout and stderr together."""
    name: str = "realtime"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def serve_engine(
    engine: Engine,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    metrics: PrometheusObserver | None = None,
    observer: Observer | None = None,
    limits: Limits | None = None,
) -> None:
    """Serve a started ``engine`` in this process until interrupted, printing the
    ``realtime: serving`` line (for servers on a fake or instrumented model); the
    engine is shut down on the way out. ``observer`` (with its ``metrics``) replaces
    the default metrics and session log; ``limits``: the defaults' unless given."""
    limits = limits or Limits()
    extra: dict[str, Any] = {}
    if metrics is not None and observer is not None:
        extra = {"metrics": metrics, "observer": observer}
    state = ServerState(engine=engine, limits=limits, **extra)
    config = hypercorn_config(host, port, limits)

    async def serve() -> None:
        async with trio.open_nursery() as nursery:
            binds: list[str] = await nursery.start(run_server, state, config)
            for bind in binds:
                url = bind.replace("http://", "ws://") + "/v1/realtime"
                print(f"realtime: serving {url}", file=sys.stderr, flush=True)

    try:
        trio.run(serve)
    finally:
        engine.shutdown()


def http_of(url: str) -> str:
    """``ws://HOST:PORT/v1/realtime`` -> ``http://HOST:PORT``."""
    return (
        url.replace("wss://", "https://").replace("ws://", "http://").removesuffix("/v1/realtime")
    )


def stop_process(proc: subprocess.Popen[bytes], grace: float = 20.0) -> None:
    """SIGTERM (the server's graceful stop), then SIGKILL after ``grace`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def launch(
    cmd: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    name: str = "realtime",
    log_dir: Path | None = None,
    cwd: Path | None = None,
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """Run ``cmd`` with its output in a log file; stopped on exit from the block."""
    fd, path = tempfile.mkstemp(prefix=f"{name}-server-", suffix=".log", dir=log_dir)
    os.close(fd)
    log = Path(path)
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            list(cmd),
            stdout=sink,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
    try:
        yield proc, log
    finally:
        stop_process(proc)


def _exited(proc: subprocess.Popen[bytes], log: Path) -> RuntimeError:
    tail = log.read_text(errors="replace")[-TAIL_CHARS:]
    return RuntimeError(f"server exited with {proc.returncode}:\n{tail}")


def wait_for_serving_line(proc: subprocess.Popen[bytes], log: Path, timeout: float = 300.0) -> str:
    """The URL from the ``realtime: serving`` line; RuntimeError if it exits or stalls."""
    deadline = time.monotonic() + timeout
    while True:
        match = SERVING_LINE.search(log.read_text(errors="replace"))
        if match:
            return match.group(1)
        if proc.poll() is not None:
            raise _exited(proc, log)
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-TAIL_CHARS:]
            raise RuntimeError(f"server did not start in {timeout:g} s:\n{tail}")
        time.sleep(0.05)


def wait_for_health(
    proc: subprocess.Popen[bytes], log: Path, http: str, timeout: float = 300.0
) -> None:
    """Poll ``GET /health`` until 200 (for servers that print no serving line)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{http}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if proc.poll() is not None:
            raise _exited(proc, log)
        if time.monotonic() > deadline:
            raise RuntimeError(f"server did not answer /health in {timeout:g} s")
        time.sleep(0.1)


@contextmanager
def start_server_process(
    *args: str,
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    name: str = "realtime",
    timeout: float = 300.0,
    log_dir: Path | None = None,
    cwd: Path | None = None,
) -> Iterator[ServerProcess]:
    """``python -m realtime serve --port 0 ARGS`` (or ``argv``), once it serves.

    ``argv`` may start any command that prints the ``realtime: serving`` line.
    """
    cmd = (
        list(argv)
        if argv is not None
        else [sys.executable, "-m", "realtime", "serve", "--port", "0", *args]
    )
    with launch(cmd, env=env, name=name, log_dir=log_dir, cwd=cwd) as (proc, log):
        url = wait_for_serving_line(proc, log, timeout)
        yield ServerProcess(proc=proc, url=url, http=http_of(url), log=log, name=name)
