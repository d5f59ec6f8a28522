from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.demo.checkpoint import ensure_demo_checkpoint, write_demo_checkpoint
from realtime.engine.facade import Engine
from realtime.models.voicechat.model import VoiceChatModel
from realtime.testing.fake import FakeModel
from tests.groups import Fixture, group_for
from tests.helpers import ServerProcess, running_engine, start_realtime_server

# Servers the tests start keep no prompt states on disk and build nothing ahead unless a
# test asks (tests/models/test_state_files.py): a state read from an earlier test's server
# would turn a cold open into a hit, and a chain built at idle priority would keep one
# of the machine's cores busy for minutes beside every other test.
os.environ.setdefault("REALTIME_STATE_CACHE_DIR", "")
os.environ.setdefault("REALTIME_BUILD_AHEAD", "0")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests sharing a costly fixture run on one worker under ``-n`` (tests/groups.py)."""
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("xdist_group"):
            continue
        module = item.nodeid.split("::")[0]
        fixtures = [
            Fixture(name, definitions[-1].scope, definitions[-1].baseid == module)
            for name, definitions in item._fixtureinfo.name2fixturedefs.items()
            if definitions
        ]
        callspec = getattr(item, "callspec", None)
        parameters = list(callspec.params.values()) if callspec is not None else []
        group = group_for(module, fixtures, parameters)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def fake_model() -> FakeModel:
    return FakeModel()


@pytest.fixture
def engine(fake_model: FakeModel) -> Iterator[Engine]:
    with running_engine(fake_model) as eng:
        yield eng


@pytest.fixture(scope="session")
def demo_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private ``REALTIME_CACHE_DIR`` holding the built demo checkpoint, for the run.

    Built here once, so server subprocesses started by tests find it ready; under
    ``pytest -n`` the workers share one (the first builds it, the others wait on its lock).
    """
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = tmp_path_factory.getbasetemp().parent / "realtime-cache"
        root.mkdir(exist_ok=True)
    else:
        root = tmp_path_factory.mktemp("realtime-cache")
    previous = os.environ.get("REALTIME_CACHE_DIR")
    os.environ["REALTIME_CACHE_DIR"] = str(root)
    try:
        ensure_demo_checkpoint()
        yield root
    finally:
        if previous is None:
            os.environ.pop("REALTIME_CACHE_DIR", None)
        else:
            os.environ["REALTIME_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def demo_path(demo_cache_dir: Path) -> Path:
    return ensure_demo_checkpoint()


@pytest.fixture(scope="session")
def demo_model(demo_path: Path) -> VoiceChatModel:
    from realtime.models import load_model

    model = load_model(demo_path)
    assert isinstance(model, VoiceChatModel)
    return model


@pytest.fixture(scope="session")
def demo_path_4bit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_demo_checkpoint(
        tmp_path_factory.mktemp("q4") / "realtime-demo-voicechat-4bit", quantize=4
    )


@pytest.fixture(scope="session")
def demo_server(
    demo_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``realtime serve`` on the demo checkpoint, one for the whole run.

    Tests that use it must leave the session slot free when they finish.
    """
    with start_realtime_server(log_dir=tmp_path_factory.mktemp("server")) as server:
        yield server


@pytest.fixture(scope="session")
def medium_model(tmp_path_factory: pytest.TempPathFactory) -> VoiceChatModel:
    """The medium demo checkpoint: real-shaped enough that the language model and the
    TTS do real work (more heads, layers and a wider codebook search than tiny)."""
    from realtime.demo.checkpoint import MEDIUM
    from realtime.models import load_model

    path = write_demo_checkpoint(tmp_path_factory.mktemp("medium") / "medium", size=MEDIUM)
    model = load_model(path)
    assert isinstance(model, VoiceChatModel)
    return model


@pytest.fixture(scope="session")
def deep_model(tmp_path_factory: pytest.TempPathFactory) -> VoiceChatModel:
    """The deep demo checkpoint: the real model's layer counts and structure (4-bit
    language model, bfloat16 rest) with tiny widths, so its graph is the real one's."""
    from realtime.demo.checkpoint import DEEP
    from realtime.models import load_model

    path = write_demo_checkpoint(
        tmp_path_factory.mktemp("deep") / "deep", quantize=DEEP.quantize, size=DEEP
    )
    model = load_model(path)
    assert isinstance(model, VoiceChatModel)
    return model


@pytest.fixture(scope="session")
def livekit() -> str:
    """LiveKit's plugin, imported on the main thread (it must be); its version. For the
    Realtime and the Live stacks' tests alike."""
    pytest.importorskip(
        "livekit.plugins.openai",
        reason="livekit-plugins-openai is not installed (a dev dependency: "
        "pip install -e '.[dev]')",
    )
    from tests.openai import livekit_exchange

    livekit_exchange.load()
    return importlib.metadata.version("livekit-plugins-openai")
