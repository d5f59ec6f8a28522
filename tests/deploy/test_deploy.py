"""The deployment recipes in ``deploy/``: the systemd unit verified by systemd itself,
and its figures kept in step with the server's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from realtime.engine.facade import Engine
from realtime.launch.server import EXIT_ENGINE_HUNG
from realtime.limits import Limits
from tests.helpers import REPO, ahttp, running_server

SYSTEMD = REPO / "deploy" / "systemd"


def settings(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of a unit or an environment file (last one wins)."""
    out = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not line.startswith(("#", "[")):
            out[key.strip()] = value.strip()
    return out


def test_the_unit_restarts_on_exit_3_and_waits_out_the_drain() -> None:
    unit, env = settings(SYSTEMD / "realtime.service"), settings(SYSTEMD / "realtime.env")
    assert unit["RestartForceExitStatus"] == str(EXIT_ENGINE_HUNG)
    assert unit["RestartPreventExitStatus"] == "2"
    assert unit["Restart"] == "on-failure" and unit["KillSignal"] == "SIGTERM"
    drain = float(env["REALTIME_DRAIN_TIMEOUT"])
    shutdown = float(env["REALTIME_SHUTDOWN_TIMEOUT"])
    assert shutdown == Limits().shutdown_timeout
    # The drain, the close bound and the engine join (3 s), with room to spare.
    assert float(unit["TimeoutStopSec"]) >= drain + shutdown + 3
    for name in ("REALTIME_MODEL", "REALTIME_HOST", "REALTIME_PORT"):
        assert "${" + name + "}" in unit["ExecStart"] and name in env
    assert env["REALTIME_ALLOWED_HOSTS"]  # a replica on 0.0.0.0 behind a real name


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    """``systemd-analyze verify`` with the paths of this checkout (it checks that the
    executable exists); any warning fails the test (unknown keys are only warned)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("REALTIME_REQUIRE_SYSTEMD"):
            pytest.fail("REALTIME_REQUIRE_SYSTEMD is set but systemd-analyze is not installed")
        pytest.skip("systemd-analyze is not installed (apt-get install systemd)")
    # The `realtime` script of the environment running the tests (nox's, CI's).
    executable = Path(sys.executable).parent / "realtime"
    if not executable.exists():
        if os.environ.get("REALTIME_REQUIRE_SYSTEMD"):
            pytest.fail(f"REALTIME_REQUIRE_SYSTEMD is set but {executable} is not installed")
        pytest.skip(f"{executable} is not installed")
    text = (SYSTEMD / "realtime.service").read_text()
    text = text.replace("/opt/realtime/.venv/bin/realtime", str(executable))
    text = text.replace("/etc/realtime/realtime.env", str(SYSTEMD / "realtime.env"))
    unit = tmp_path / "realtime.service"
    unit.write_text(text)
    run = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0 and not run.stderr.strip() and not run.stdout.strip(), (
        run.stdout + run.stderr
    )


async def test_every_exported_metric_is_listed_in_the_deploy_guide(engine: Engine) -> None:
    """docs/deploy.md's Prometheus table names every ``realtime_*`` family a scrape has."""
    async with running_server(engine) as server:
        status, body = await ahttp("GET", server.http + "/metrics")
    assert status == 200
    families = {
        line.split()[2]
        for line in body.decode().splitlines()
        if line.startswith("# TYPE realtime_")
    }
    guide = (REPO / "docs" / "deploy.md").read_text()
    missing = sorted(name for name in families if f"`{name}" not in guide)
    assert not missing, missing
