from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from realtime.engine import Engine
from realtime.models.fake import FakeModel, say
from tests.helpers import running_engine
from tests.openai.scripted import scripted as scripted_model


@pytest.fixture
def scripted() -> FakeModel:
    return scripted_model(say("Hi ", "there", None, "!"), say("Bye", None, "!"))


@pytest.fixture
def scripted_engine(scripted: FakeModel) -> Iterator[Engine]:
    with running_engine(scripted) as eng:
        yield eng


def pip_target(factory: pytest.TempPathFactory, name: str, *specs: str) -> Path:
    """``specs`` installed (no dependencies) into a folder of their own, for a subprocess
    to put first on ``PYTHONPATH``; skips when the package index cannot be reached."""
    target = factory.mktemp(name)
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                *specs,
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        pytest.skip(f"could not install {' '.join(specs)} from the package index: {exc}")
    return target


@pytest.fixture(scope="session")
def openai_2_8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """openai 2.8.1: GA types, but before 2.27 it forces wss unless websocket_base_url."""
    return pip_target(
        tmp_path_factory, "openai-2.8.1", "openai==2.8.1", "httpx<1", "httpcore<2", "distro<2"
    )


@pytest.fixture(scope="session")
def pipecat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Pipecat's realtime event parser (the package without its heavy dependencies)."""
    return pip_target(
        tmp_path_factory,
        "pipecat",
        "pipecat-ai==1.14.0",
        "loguru",
        "wait_for2",
        "docstring_parser",
        "loudness",
        "sentencex",
    )
