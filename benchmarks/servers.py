"""Servers under test, each a subprocess on 127.0.0.1, started one at a time.

Subprocesses keep the client's Python (and GIL) out of the server's, and give
the churn row a process whose RSS it can read.
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from realtime.testing import servers as testing

REPO = Path(__file__).resolve().parent.parent
START_TIMEOUT = 300.0


@attrs.frozen
class ServerProcess(testing.ServerProcess):
    """A server under test, with the figures the benchmark reads from its process."""

    def rss_bytes(self) -> int | None:
        return rss_bytes(self.proc.pid)

    def cpu_seconds(self) -> float | None:
        return cpu_seconds(self.proc.pid)


def _psutil() -> Any:
    """psutil if installed (it is optional), else None."""
    try:
        return importlib.import_module("psutil")
    except ImportError:
        return None


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid``: psutil when installed, else ``/proc``."""
    psutil = _psutil()
    if psutil is not None:
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` (all threads): a load-independent cost figure."""
    psutil = _psutil()
    if psutil is not None:
        try:
            times = psutil.Process(pid).cpu_times()
            return float(times.user + times.system)
        except psutil.Error:
            return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def launch(name: str, cmd: Sequence[str], env: dict[str, str]) -> Iterator[tuple[Any, Path]]:
    with testing.launch(cmd, env=env, name=f"bench-{name}", cwd=REPO) as launched:
        yield launched


def wait_for_serving_line(proc: subprocess.Popen[bytes], log: Path) -> str:
    return testing.wait_for_serving_line(proc, log, START_TIMEOUT)


def wait_for_health(proc: subprocess.Popen[bytes], log: Path, http: str) -> None:
    testing.wait_for_health(proc, log, http, START_TIMEOUT)


def _started(name: str, cmd: Sequence[str]) -> Iterator[ServerProcess]:
    with launch(name, cmd, {}) as (proc, log):
        url = wait_for_serving_line(proc, log)
        yield ServerProcess(proc, url, testing.http_of(url), log, name)


@contextmanager
def ours(model_path: Path | None, *options: str) -> Iterator[ServerProcess]:
    """``python -m realtime serve -m PATH --port 0 [OPTIONS]``: this project's server
    (``model_path`` None: no ``-m``, the built-in tiny demo with its scripted turns)."""
    model = [] if model_path is None else ["-m", str(model_path)]
    cmd = [sys.executable, "-m", "realtime", "serve", *model, "--port", "0"]
    cmd += ["--host", "127.0.0.1", *options]
    yield from _started("ours", cmd)


@contextmanager
def null_server(*, metrics: bool = True) -> Iterator[ServerProcess]:
    """This project's server on the zero-cost model (``metrics=False``: a no-op observer)."""
    cmd = [sys.executable, "-m", "benchmarks.null_server", "--port", "0"]
    if not metrics:
        cmd.append("--no-metrics")
    yield from _started("null", cmd)


@contextmanager
def peer(model_path: Path) -> Iterator[ServerProcess]:
    """``python -m mlx_vlm.server``: mlx-vlm's own FastAPI ``/v1/realtime``.

    Its realtime engine loads the VoiceChat model on the first ``session.update``
    (``session.model`` names the checkpoint), whatever ``--model`` says, so the
    benchmark warms it with one session before measuring.
    """
    port = free_port()
    cmd = [sys.executable, "-m", "mlx_vlm.server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--log-level", "WARNING"]
    with launch("peer", cmd, {}) as (proc, log):
        http = f"http://127.0.0.1:{port}"
        wait_for_health(proc, log, http)
        yield ServerProcess(proc, f"ws://127.0.0.1:{port}/v1/realtime", http, log, "peer")
