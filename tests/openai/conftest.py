from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.engine.facade import Engine
from realtime.testing.fake import FakeModel, say
from tests.environments import prepared_environment
from tests.helpers import running_engine
from tests.openai.scripted import scripted as scripted_model


@pytest.fixture
def scripted() -> FakeModel:
    return scripted_model(say("Hi ", "there", None, "!"), say("Bye", None, "!"))


@pytest.fixture
def scripted_engine(scripted: FakeModel) -> Iterator[Engine]:
    with running_engine(scripted) as eng:
        yield eng


@pytest.fixture(scope="session")
def openai_2_8() -> Path:
    """openai 2.8.1: GA types, but before 2.27 it forces wss unless websocket_base_url."""
    return prepared_environment("openai-2.8.1")


@pytest.fixture(scope="session")
def pipecat() -> Path:
    """Pipecat's realtime event parser (the package without its heavy dependencies)."""
    return prepared_environment("pipecat")
