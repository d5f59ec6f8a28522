from __future__ import annotations

from pathlib import Path

import pytest

from tests.environments import prepared_environment


@pytest.fixture(scope="session")
def pipecat() -> Path:
    """Pipecat (the package without its heavy dependencies), for a subprocess."""
    return prepared_environment("pipecat")
