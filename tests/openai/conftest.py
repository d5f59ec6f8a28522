from __future__ import annotations

from collections.abc import Iterator

import pytest

from realtime.engine import Engine
from tests.openai.scripted import ScriptedModel, say


@pytest.fixture
def scripted() -> ScriptedModel:
    return ScriptedModel([say("Hi ", "there", None, "!"), say("Bye", None, "!")])


@pytest.fixture
def scripted_engine(scripted: ScriptedModel) -> Iterator[Engine]:
    eng = Engine(lambda: scripted)
    eng.start()
    yield eng
    eng.shutdown()
