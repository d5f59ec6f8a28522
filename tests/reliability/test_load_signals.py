"""A signal while ``realtime serve`` loads its model ends the process at once.

A model load cannot be cancelled (it is native code on the engine thread), so
SIGINT must not wait for it: before the fix the main thread joined the loading
thread, which, once the load finished, waited for commands forever. These tests
run the real command line with a loader that takes ten minutes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from realtime.testing.servers import launch
from tests.helpers import REPO

LOADING = "slow loader: loading"

SERVE_SLOW_LOAD = f"""
import faulthandler, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's stacks on a hang
# A test run started in the background by a non-interactive shell (nohup ... &) starts
# its children with SIGINT ignored, and Python then installs no KeyboardInterrupt:
# give this server the SIGINT a user's terminal gives it.
signal.signal(signal.SIGINT, signal.default_int_handler)
import realtime.launch.server
from realtime.launch.cli import main

def slow_loader(model, quantize, **_):
    def load():
        print({LOADING!r}, file=sys.stderr, flush=True)
        if "--signal-this-thread" in sys.argv:
            import threading
            time.sleep(0.5)
            # The kernel may hand a process's SIGINT to any thread: here, this one.
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        time.sleep(600)  # like a native load: the GIL is free, nothing can stop it
        raise AssertionError("the ten-minute load finished")
    return load

realtime.launch.server.model_loader = slow_loader
args = [a for a in sys.argv[1:] if a != "--signal-this-thread"]
sys.exit(main([*args, "serve", "--port", "0"]))
"""

EXIT_BOUND = 5.0
"""Seconds from the signal to the exit that the tests accept (it takes ~0.1 s)."""


def signal_during_load(signum: signal.Signals, *args: str) -> tuple[int, float, str]:
    """Start ``realtime serve`` on the slow loader, send ``signum`` once it loads;
    the exit status, the seconds from the signal to the exit and the output."""
    cmd = [sys.executable, "-c", SERVE_SLOW_LOAD, *args]
    with launch(cmd, cwd=REPO, name="slow-load") as (proc, log):
        deadline = time.monotonic() + 120
        while LOADING not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the loader never started"
            time.sleep(0.02)
        time.sleep(0.2)  # the main thread now waits for the load
        sent = time.monotonic()
        proc.send_signal(signum)
        try:
            code = proc.wait(EXIT_BOUND * 2)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # every thread's stack into the log
            time.sleep(1.0)
            raise AssertionError(
                f"{signum.name} during the model load did not end the process:\n"
                + log.read_text(errors="replace")
            ) from None
        elapsed = time.monotonic() - sent
        return code, elapsed, Path(log).read_text(errors="replace")


def test_sigint_during_the_model_load_exits_130_at_once() -> None:
    code, elapsed, output = signal_during_load(signal.SIGINT)
    assert code == 130, output
    assert elapsed < EXIT_BOUND, (elapsed, output)
    assert "Traceback" not in output, output
    assert "the ten-minute load finished" not in output, output
    assert output.splitlines()[-1] == (
        "realtime: interrupted (SIGINT) while the model was loading; exiting"
    ), output
    assert output.count("SIGINT") == 1, output


def test_sigint_delivered_to_the_loading_thread_still_ends_the_process() -> None:
    """A signal is the process's: Linux may deliver it to the engine thread, whose C
    handler only flags it for the main thread. A main thread blocked in a wait with no
    timeout never ran the handler (the process hung); it now waits in steps."""
    cmd = [sys.executable, "-c", SERVE_SLOW_LOAD, "--signal-this-thread"]
    with launch(cmd, cwd=REPO, name="slow-load") as (proc, log):
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
            raise AssertionError(log.read_text(errors="replace")) from None
        output = log.read_text(errors="replace")
    assert code == 130, output
    assert "Traceback" not in output, output
    assert output.splitlines()[-1].startswith("realtime: interrupted (SIGINT)"), output


def test_sigterm_during_the_model_load_ends_the_process_at_once() -> None:
    """No handler is installed before serving: SIGTERM's default action kills the
    process (status -15 here, 143 in a shell), as it always has."""
    code, elapsed, output = signal_during_load(signal.SIGTERM)
    assert code == -signal.SIGTERM, output
    assert elapsed < EXIT_BOUND, (elapsed, output)
    assert "Traceback" not in output, output
