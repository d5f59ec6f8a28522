"""The resume flags of ``realtime serve``: grace, journal bounds, the replica's name."""

from __future__ import annotations

import pytest

from realtime.cli import build_parser, limits_from_args
from realtime.limits import Limits
from realtime.session.resume import replica_id


def test_the_resume_limits_are_flags_with_their_defaults() -> None:
    limits = limits_from_args(build_parser().parse_args(["serve"]))
    assert (limits.resume_grace, limits.resume_journal_bytes, limits.resume_journal_seconds) == (
        30.0,
        8 * 1024 * 1024,
        60.0,
    )
    args = build_parser().parse_args(
        [
            "serve",
            "--resume-grace=0",
            "--resume-journal-bytes=1000",
            "--resume-journal-seconds=5",
            "--replica-id=r-1.eu",
        ]
    )
    assert limits_from_args(args) == Limits(
        resume_grace=0, resume_journal_bytes=1000, resume_journal_seconds=5
    )
    assert args.replica_id == "r-1.eu"


def test_serve_help_names_every_resume_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = capsys.readouterr().out
    for flag in ("--resume-grace", "--resume-journal-bytes", "--resume-journal-seconds"):
        assert flag in text
    assert "--replica-id" in text


@pytest.mark.parametrize(
    "flag", ["--resume-journal-bytes=0", "--resume-journal-seconds=0", "--resume-grace=-1"]
)
def test_a_bad_bound_exits_2(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", flag])
    assert exited.value.code == 2


@pytest.mark.parametrize("bad", ["-r1", "a b", "x" * 65, "r/1", "é"])
def test_a_bad_replica_id_exits_2(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["serve", f"--replica-id={bad}"])
    assert exited.value.code == 2
    assert "--replica-id" in capsys.readouterr().err
    with pytest.raises(ValueError, match="letters, digits"):
        replica_id(bad)


def test_the_replica_id_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REALTIME_REPLICA_ID", "r2")
    assert build_parser().parse_args(["serve"]).replica_id == "r2"
    assert replica_id("") is None
