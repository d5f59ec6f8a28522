"""Which tests share a worker when the suite runs in parallel (``pytest -n 2 --dist
loadgroup``, what ``nox`` and CI run).

Under pytest-xdist each worker is a process of its own, so a session or module fixture is
set up once per worker that runs a test using it. Tests that share a costly fixture (a
server process, a browser, a checkpoint built and loaded) are therefore kept on one worker
as an ``xdist_group``; every other test is handed to whichever worker is free.

To join: a costly session fixture gets a line in :data:`SHARED`, a module whose tests must
take turns a line in :data:`MODULES`; a module-scoped fixture needs nothing (its module's
tests are grouped by themselves); any test can also name its group itself with
``@pytest.mark.xdist_group("name")`` (docs/testing.md).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

SHARED: dict[str, str] = {
    "demo_server": "demo-server",
    "medium_model": "medium-model",
}
"""Session fixture -> the group of every test that uses it, directly or through a
parameter that names it (``request.getfixturevalue``)."""

MODULES: dict[str, str] = {
    "tests/benchmarks/test_benchmarks.py": "benchmarks",
}
"""Module -> the group of all its tests. The benchmark smoke tests each run a server,
its clients and mlx-vlm's peer in subprocesses that keep both cores busy: two at once
only slow each other towards pytest's timeout, so they take turns on one worker."""


@attrs.frozen(slots=True)
class Fixture:
    """One fixture a test uses: its name, scope and whether its test's module defines it."""

    name: str
    scope: str
    in_module: bool


def group_for(module: str, fixtures: Iterable[Fixture], parameters: Iterable[object]) -> str | None:
    """The ``xdist_group`` of a test in ``module`` using ``fixtures`` with parameter values
    ``parameters``: its module's group if listed, else a shared session fixture's group,
    else its module when the module defines a module-scoped fixture the test uses, else
    none (any free worker)."""
    if module in MODULES:
        return MODULES[module]
    used = list(fixtures)
    for fixture in used:
        if fixture.name in SHARED:
            return SHARED[fixture.name]
    for value in parameters:
        if isinstance(value, str) and value in SHARED:
            return SHARED[value]
    if any(fixture.scope == "module" and fixture.in_module for fixture in used):
        return module
    return None
