from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from tests.environments import prepared_environment
from tests.openai import livekit_exchange


@pytest.fixture(scope="session")
def pipecat() -> Path:
    """Pipecat (the package without its heavy dependencies), for a subprocess."""
    return prepared_environment("pipecat")


@pytest.fixture(scope="session")
def livekit() -> str:
    """LiveKit's plugin, imported on the main thread (it must be); its version."""
    pytest.importorskip(
        "livekit.plugins.openai",
        reason="livekit-plugins-openai is not installed (a dev dependency: "
        "pip install -e '.[dev]')",
    )
    livekit_exchange.load()
    return importlib.metadata.version("livekit-plugins-openai")
