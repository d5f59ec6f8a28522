"""The rule that keeps tests sharing a costly fixture on one worker (tests/groups.py)."""

from __future__ import annotations

from tests.groups import MODULES, SHARED, Fixture, group_for

MODULE = "tests/test_x.py"


def test_a_shared_session_fixture_names_the_group() -> None:
    fixtures = [Fixture("tmp_path", "function", False), Fixture("demo_server", "session", False)]
    assert group_for(MODULE, fixtures, []) == SHARED["demo_server"]


def test_a_parameter_naming_a_shared_fixture_names_the_group() -> None:
    """``request.getfixturevalue(name)`` with ``name`` a parameter (the model sweeps)."""
    assert group_for(MODULE, [Fixture("request", "function", False)], ["medium_model", 3])
    assert group_for(MODULE, [], ["demo_model"]) is None


def test_a_module_fixture_of_the_module_keeps_its_tests_together() -> None:
    assert group_for(MODULE, [Fixture("key_server", "module", True)], []) == MODULE
    # A module fixture from a conftest is not this module's: no group.
    assert group_for(MODULE, [Fixture("pool", "module", False)], []) is None


def test_the_session_fixture_wins_over_the_module() -> None:
    fixtures = [Fixture("key_server", "module", True), Fixture("demo_server", "session", False)]
    assert group_for(MODULE, fixtures, []) == SHARED["demo_server"]


def test_everything_else_goes_to_any_free_worker() -> None:
    fixtures = [Fixture("demo_model", "session", False), Fixture("engine", "function", True)]
    assert group_for(MODULE, fixtures, [1, "x"]) is None


def test_a_listed_module_is_one_group() -> None:
    module = next(iter(MODULES))
    fixtures = [Fixture("demo_server", "session", False)]
    assert group_for(module, fixtures, []) == group_for(module, [], []) == MODULES[module]
