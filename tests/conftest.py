from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.engine import Engine
from tests.fakes import FakeModel
from tests.helpers import ServerProcess, start_realtime_server


@pytest.fixture
def fake_model() -> FakeModel:
    return FakeModel()


@pytest.fixture
def engine(fake_model: FakeModel) -> Iterator[Engine]:
    eng = Engine(lambda: fake_model)
    eng.start()
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def demo_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private cache for the demo checkpoint, shared by every test of the run."""
    path = Path(os.environ.get("REALTIME_TEST_CACHE_DIR") or tmp_path_factory.mktemp("cache"))
    old = os.environ.get("REALTIME_CACHE_DIR")
    os.environ["REALTIME_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("REALTIME_CACHE_DIR", None)
    else:
        os.environ["REALTIME_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def demo_server(
    demo_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``realtime serve`` on the demo checkpoint, one for the whole run.

    Tests that use it must leave the session slot free when they finish.
    """
    with start_realtime_server(log_dir=tmp_path_factory.mktemp("server")) as server:
        yield server
