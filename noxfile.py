"""Developer sessions: ``nox`` runs lint, typecheck and tests (what CI runs)."""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv|venv"
"""uv installs a session's environment in seconds (pip took minutes per session); plain
venv + pip when uv is not installed."""

PYTHON = os.environ.get("REALTIME_NOX_PYTHON") or None


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, tests, examples and benchmarks."""
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite (real-checkpoint tests skip unless REALTIME_VOICECHAT_MODEL)."""
    session.install("-e", ".[dev]")
    session.run("pytest", *session.posargs)


@nox.session(python=PYTHON)
def serve(session: nox.Session) -> None:
    """Start the server on the built-in demo model (args go to ``realtime serve``)."""
    session.install("-e", ".")
    session.run("realtime", "serve", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: bare model, zero-cost server, paced/unpaced, responsiveness, churn, peer."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "benchmarks", *session.posargs)
