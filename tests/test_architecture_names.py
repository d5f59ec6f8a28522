"""docs/architecture.md names today's code: every module path, dotted name and class it
puts in backticks resolves in the package as it is now (a renamed or removed module, class
or method fails here, not in a newcomer's search)."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

import realtime

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "architecture.md"
CODE = re.compile(r"`([^`\s]+)`")
DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")
CLASS = re.compile(r"^_?[A-Z][a-z]+[A-Za-z0-9]*$")
FILE = re.compile(r"^[a-z_.][a-z_/.-]*\.(py|sh|toml|md|json|txt|cfg|ya?ml)$")

FOREIGN = frozenset(
    {
        # Other projects' names the page explains ours against.
        "ParkingLot",
        "RotatingKVCache",
        "VoiceChatStreamingSession",
        "TypeError",
        "None",
        "TrioToken.run_sync_soon",
        # MLX graph primitives the frame step's counts name.
        "Pad",
        "RandomBits",
        "SliceUpdate",
        # Wire event types and /health fields.
        "response.cancel",
        "response.cancelled",
        "session.cancel",
        "websocket.disconnect",
        "prompt_cache.pinned_bytes",
        "prompt_cache.disk_ignored",
    }
)
"""Backticked names that are not this package's code."""
FOREIGN_ROOTS = frozenset({"trio", "threading", "concurrent", "mx", "mlx", "nn", "random"})
"""Other packages whose names the page uses (``trio.to_thread.run_sync``)."""
ROOTS = ("realtime", "benchmarks", "tests")


@cache
def modules() -> dict[str, ModuleType]:
    """Every module of the package, by its dotted name (``realtime.x.y``)."""
    found = {"realtime": realtime}
    for info in pkgutil.walk_packages(realtime.__path__, "realtime."):
        if info.name != "realtime.__main__":  # it runs the command
            found[info.name] = importlib.import_module(info.name)
    return found


def _attr(owner: object, path: list[str]) -> bool:
    for name in path:
        if not hasattr(owner, name):
            return False
        owner = getattr(owner, name)
    return True


def resolves(name: str) -> bool:
    """``name`` (``module.Name.attr``, ``folder/module.Name``, ``Name.attr`` or a bare
    class name) names something in the package."""
    if name in FOREIGN or name.split(".")[0] in FOREIGN_ROOTS:
        return True
    if name.split(".")[0] in ROOTS[1:]:  # benchmarks.graph: a module of the repository
        return (REPO / (name.replace(".", "/") + ".py")).is_file()
    if "/" in name and not name.endswith((".py", ".sh", "/")):
        folder, _, rest = name.partition(".")
        name = folder.replace("/", ".") + "." + rest
    parts = name.split(".")
    mods = modules()
    # A module suffix (``session.pipeline``, ``realtime.session.pipeline``), then attributes.
    for dotted, module in mods.items():
        for cut in range(len(parts), 0, -1):
            head = ".".join(parts[:cut])
            if (dotted == head or dotted.endswith("." + head)) and _attr(module, parts[cut:]):
                return True
    # A class of any module, then attributes (``EngineThread._slice``).
    return bool(CLASS.match(parts[0])) and any(_attr(module, parts) for module in mods.values())


def named() -> Iterator[str]:
    for token in CODE.findall(DOC.read_text()):
        token = token.rstrip(",.:;()")
        if FILE.match(token) or token.endswith("/") or DOTTED.match(token) or CLASS.match(token):
            yield token


def file_exists(token: str) -> bool:
    if token.startswith(ROOTS) or (REPO / token).exists() or (REPO / "docs" / token).exists():
        return (REPO / token).exists() or (REPO / "docs" / token).exists()
    return (REPO / "realtime" / token).exists() or any(
        path.as_posix().endswith("/" + token)
        for path in (REPO / "realtime").rglob(token.rsplit("/", 1)[-1])
    )


def test_every_name_the_architecture_page_uses_exists() -> None:
    missing = []
    for token in sorted(set(named())):
        if FILE.match(token) or token.endswith("/"):
            if not file_exists(token):
                missing.append(token)
        elif not resolves(token):
            missing.append(token)
    assert not missing, f"docs/architecture.md names what the package no longer has: {missing}"


@pytest.mark.parametrize("token", ["protocol.parse_client_message", "models/demo.DemoTurnModel"])
def test_stale_names_are_caught(token: str) -> None:
    assert not resolves(token)
