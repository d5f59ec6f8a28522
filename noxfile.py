"""Developer sessions: ``nox`` runs lint, typecheck and tests (what CI runs).

Every session installs the exact versions in ``uv.lock`` (``uv sync --locked``), so a run
next month tests what today's run tested; ``nox -s latest`` (not in the default sessions)
runs the suite on the newest releases instead and says what changed.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv"
"""uv reads the lock file and installs a session's environment in seconds."""

PYTHON = os.environ.get("REALTIME_NOX_PYTHON") or None

PYTEST_DEFAULTS = [
    "--durations=25",
    "-n",
    os.environ.get("REALTIME_TEST_WORKERS", "2"),
    "--dist",
    "loadgroup",
]
"""Without arguments the suite runs as CI runs it: its 25 slowest tests in the log, on two
worker processes, the tests of one group (tests/groups.py) on one worker
(``REALTIME_TEST_WORKERS=0`` runs it in one process)."""

BOUNDED = ("hypercorn", "wsproto", "h11", "quart", "quart-trio", "mlx", "mlx-vlm", "mlx-audio")
"""The dependencies whose internals the project touches (upper bounds in pyproject.toml)."""

ENVIRONMENTS = Path(__file__).parent / "tests" / "environments"


def sync(session: nox.Session, *args: str) -> None:
    """The locked versions into the session's environment (``uv sync --locked``)."""
    session.run_install(
        "uv",
        "sync",
        "--locked",
        *args,
        env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
    )


def prepare_environments(session: nox.Session) -> str:
    """Each ``tests/environments/NAME.txt`` installed (no dependencies) into a folder of
    its own for the tests that run another client stack in a subprocess; returns the root
    for ``REALTIME_TEST_ENVS``."""
    root = Path(session.virtualenv.location) / "test-environments"
    for requirements in sorted(ENVIRONMENTS.glob("*.txt")):
        target = root / requirements.stem
        stamp = target / ".requirements"
        wanted = requirements.read_text()
        if stamp.is_file() and stamp.read_text() == wanted:
            continue
        shutil.rmtree(target, ignore_errors=True)
        session.run_install(
            "uv",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--python",
            session.virtualenv.location,
            "--target",
            str(target),
            "-r",
            str(requirements),
        )
        stamp.write_text(wanted)
    return str(root)


def versions(requirements: str) -> dict[str, set[str]]:
    """``name==version`` lines as name -> versions (markers and comments dropped: the lock
    may hold two versions of one package, for two Python versions or platforms)."""
    found: dict[str, set[str]] = {}
    for line in requirements.splitlines():
        name, sep, version = line.split(";")[0].strip().partition("==")
        if sep and not name.startswith("#"):
            key = name.lower().replace("_", "-").replace(".", "-")
            found.setdefault(key, set()).add(version.strip())
    return found


def changes(locked: str, installed: str) -> list[str]:
    """What ``latest`` runs on that the lock does not: one line per changed package."""
    was, now = versions(locked), versions(installed)
    return [
        f"{name}: {' or '.join(sorted(was[name]))} (uv.lock) -> {' '.join(sorted(now[name]))}"
        for name in sorted(was.keys() & now.keys())
        if not now[name] <= was[name]
    ] or ["every package is at its uv.lock version"]


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    sync(session, "--only-group", "lint")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, tests, examples and benchmarks; the package's
    floors (import-linter's contract in pyproject.toml: imports run one way)."""
    sync(session, "--extra", "dev")
    session.run("mypy")
    session.run("lint-imports")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite (real-checkpoint tests skip unless REALTIME_VOICECHAT_MODEL)."""
    sync(session, "--extra", "dev")
    root = prepare_environments(session)
    session.run("pytest", *(session.posargs or PYTEST_DEFAULTS), env={"REALTIME_TEST_ENVS": root})


@nox.session(python=PYTHON)
def latest(session: nox.Session) -> None:
    """The suite on the newest releases, upper bounds lifted (not CI's gate): prints each
    package whose version differs from uv.lock, then pytest's summary says what broke."""
    overrides = Path(session.create_tmp()) / "overrides.txt"
    overrides.write_text("".join(f"{name}\n" for name in BOUNDED))
    session.install("--upgrade", "--override", str(overrides), "-e", ".[dev]")
    locked = session.run_install(
        "uv",
        "export",
        "--locked",
        "--extra",
        "dev",
        "--no-hashes",
        "--no-emit-project",
        "--no-header",
        "--no-annotate",
        "--format",
        "requirements-txt",
        silent=True,
    )
    installed = session.run_install(
        "uv", "pip", "freeze", "--python", session.virtualenv.location, silent=True
    )
    for line in changes(str(locked), str(installed)):
        session.log(line)
    root = prepare_environments(session)
    session.run("pytest", *(session.posargs or PYTEST_DEFAULTS), env={"REALTIME_TEST_ENVS": root})


@nox.session(python=PYTHON)
def serve(session: nox.Session) -> None:
    """Start the server on the built-in demo model (args go to ``realtime serve``)."""
    sync(session)
    session.run("realtime", "serve", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: bare model, zero-cost server, paced/unpaced, responsiveness, churn, peer."""
    sync(session, "--extra", "dev")
    session.run("python", "-m", "benchmarks", *session.posargs)
