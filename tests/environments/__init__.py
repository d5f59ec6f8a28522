"""Client stacks that cannot share the suite's environment (an older openai SDK, Pipecat
without its heavy dependencies), each a folder a subprocess puts first on ``PYTHONPATH``.

No test installs anything while it runs: ``nox -s tests`` installs each ``NAME.txt`` here
(exact versions, no dependencies) into ``$REALTIME_TEST_ENVS/NAME`` before pytest starts.
Without that folder the tests that need it skip with the reason, or fail under
``REALTIME_REQUIRE_TEST_ENVS=1`` (CI), so they cannot skip silently there.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REQUIREMENTS = Path(__file__).parent
"""One ``NAME.txt`` per environment, read by the noxfile."""


def missing_reason(name: str, root: str | None) -> str | None:
    """Why environment ``name`` under ``root`` (``$REALTIME_TEST_ENVS``) cannot be used."""
    if not (REQUIREMENTS / f"{name}.txt").is_file():
        return f"no tests/environments/{name}.txt"
    if not root:
        return (
            f"REALTIME_TEST_ENVS is not set: `nox -s tests` prepares {name} from "
            f"tests/environments/{name}.txt (or: uv pip install --no-deps --target "
            f"DIR/{name} -r tests/environments/{name}.txt; REALTIME_TEST_ENVS=DIR)"
        )
    if not (Path(root) / name).is_dir():
        return f"{Path(root) / name} does not exist (prepared by `nox -s tests`)"
    return None


def prepared_environment(name: str) -> Path:
    """The folder holding environment ``name``; skips (fails under
    ``REALTIME_REQUIRE_TEST_ENVS=1``) when it has not been prepared."""
    root = os.environ.get("REALTIME_TEST_ENVS")
    reason = missing_reason(name, root)
    if reason is None:
        assert root is not None
        return Path(root) / name
    if os.environ.get("REALTIME_REQUIRE_TEST_ENVS") == "1":
        pytest.fail(f"REALTIME_REQUIRE_TEST_ENVS=1 but {reason}", pytrace=False)
    pytest.skip(reason)
