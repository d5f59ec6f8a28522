"""Limits as flags and environment settings, made from the Limits fields; exit code 2."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import pytest

from realtime.launch.cli import build_parser, limits_from_args, main
from realtime.limits import Limits, Setting, limit_settings, limits_from_env


def test_every_limit_has_a_flag_and_an_env_setting() -> None:
    names = [field.name for field in attrs.fields(Limits)]
    specs = limit_settings()
    assert [s.name for s in specs] == names
    defaults = Limits()
    for spec in specs:
        assert spec.flag == "--" + spec.name.replace("_", "-")
        assert spec.env == "REALTIME_" + spec.name.upper()
        assert spec.help and spec.kind in (int, float)
        assert spec.default == getattr(defaults, spec.name)
    assert {s.flag for s in specs} >= {
        "--max-message-bytes",
        "--max-pending-audio-seconds",
        "--configure-timeout",
        "--idle-timeout",
        "--send-timeout",
        "--send-queue-events",
    }


def test_flags_and_env_give_the_same_limits() -> None:
    flags: list[str] = []
    env: dict[str, str] = {}
    for number, spec in enumerate(limit_settings(), start=2):
        flags += [spec.flag, str(number)]
        env[spec.env] = str(number)
    from_flags = limits_from_args(build_parser().parse_args(["serve", *flags]))
    assert from_flags == limits_from_env(env)
    assert from_flags != Limits()
    assert limits_from_args(build_parser().parse_args(["serve"])) == Limits()
    assert limits_from_env({}) == Limits()


def test_serve_help_lists_every_limit_with_its_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for spec in limit_settings():
        assert f"{spec.flag} {spec.name.upper()} {spec.help} (default {spec.default})" in text


@pytest.mark.parametrize("spec", limit_settings(), ids=lambda s: s.name)
@pytest.mark.parametrize("bad", ["0", "-1", "abc", "nan", "inf", ""])
def test_bad_flag_value_exits_2(
    spec: Setting, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if bad == "0" and spec.zero_allowed:
        assert build_parser().parse_args(["serve", f"{spec.flag}=0"]) is not None
        return
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", f"{spec.flag}={bad}"])
    assert info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert (
        error
        == f"realtime serve: error: argument {spec.flag}: expected {spec.requirement}, got {bad!r}"
    )


@pytest.mark.parametrize("spec", limit_settings(), ids=lambda s: s.name)
def test_bad_env_value_is_refused(spec: Setting) -> None:
    with pytest.raises(ValueError, match=f"^{spec.env} must be a number, got 'abc'$"):
        limits_from_env({spec.env: "abc"})
    if spec.zero_allowed:
        with pytest.raises(ValueError, match=f"^{spec.env} must be >= 0, got '-1'$"):
            limits_from_env({spec.env: "-1"})
    else:
        with pytest.raises(ValueError, match=f"^{spec.env} must be > 0, got '0'$"):
            limits_from_env({spec.env: "0"})
    if spec.kind is int:
        with pytest.raises(ValueError, match="must be a number"):
            limits_from_env({spec.env: "1.5"})


def test_bad_env_value_stops_the_asgi_app(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("REALTIME_MODEL", raising=False)
    import realtime.launch.asgi

    monkeypatch.setenv("REALTIME_IDLE_TIMEOUT", "soon")
    with pytest.raises(SystemExit) as info:
        realtime.launch.asgi.create_app_from_env()
    assert info.value.code == 2
    err = capsys.readouterr().err  # (importing the module may have logged its demo warning)
    assert err.splitlines()[-1] == (
        "realtime: error: REALTIME_IDLE_TIMEOUT must be a number, got 'soon'"
    )
    assert err.count("realtime: error:") == 1


def test_limits_refuse_bad_values_themselves() -> None:
    with pytest.raises(ValueError, match="idle_timeout must be a number > 0, got 0"):
        Limits(idle_timeout=0)
    with pytest.raises(ValueError, match="send_queue_events must be an integer > 0"):
        Limits(send_queue_events=2.5)  # type: ignore[arg-type]
    assert Limits(configure_timeout=1).configure_timeout == 1


def test_a_setting_may_allow_zero() -> None:
    drain = Setting(name="drain_timeout", kind=float, help="h", default=0.0, zero_allowed=True)
    assert drain.parse("0") == 0.0 and drain.requirement == "a number >= 0"
    with pytest.raises(ValueError, match="expected a number >= 0, got '-1'"):
        drain.parse("-1")


def test_usage_and_model_path_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from realtime.audio import write_wav_pcm16

    out = str(tmp_path / "out.wav")
    assert main(["generate", "--input", str(tmp_path / "none.wav"), "--output", out]) == 2
    assert capsys.readouterr().err.strip() == (
        f"realtime: error: input file {tmp_path / 'none.wav'} does not exist or is not a file"
    )
    wav = tmp_path / "in.wav"
    write_wav_pcm16(wav, np.zeros(1600, dtype=np.int16), 16000)
    missing = tmp_path / "no-model"
    assert main(["generate", "-m", str(missing), "--input", str(wav), "--output", out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"realtime: error: model path {missing} ")
    assert main(["serve", "-m", str(missing)]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert err[-1].startswith(f"realtime: error: model path {missing} ")


def test_serve_reads_limits_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REALTIME_DRAIN_TIMEOUT", "300")
    monkeypatch.setenv("REALTIME_SHUTDOWN_TIMEOUT", "2.5")
    limits = limits_from_args(build_parser().parse_args(["serve"]))
    assert (limits.drain_timeout, limits.shutdown_timeout) == (300, 2.5)
    flags = build_parser().parse_args(["serve", "--drain-timeout", "0"])
    assert limits_from_args(flags).drain_timeout == 0


def test_serve_prints_the_native_openai_live_and_page_urls() -> None:
    from realtime.launch.server import serving_lines
    from realtime.testing.servers import SERVING_LINE

    lines = serving_lines(["http://127.0.0.1:8080"], max_sessions=3)
    assert lines == [
        "realtime: serving ws://127.0.0.1:8080/v1/realtime",
        "realtime: OpenAI Realtime endpoint ws://127.0.0.1:8080/openai/v1/realtime",
        "realtime: OpenAI Live endpoint ws://127.0.0.1:8080/openai/v1/live/sessions",
        "realtime: browser page http://127.0.0.1:8080/ (3 conversations at once)",
    ]
    # Tools that wait for the serving line find the native URL, and only that one.
    found = [m.group(1) for line in lines if (m := SERVING_LINE.search(line))]
    assert found == ["ws://127.0.0.1:8080/v1/realtime"]
    assert serving_lines(["http://[::1]:1"])[3] == "realtime: browser page http://[::1]:1/"


@pytest.mark.parametrize(
    "command", [["serve"], ["generate", "--input", "a.wav", "--output", "b.wav"]]
)
def test_no_compile_runs_the_step_uncompiled(command: list[str]) -> None:
    """``--no-compile`` is off by default: the step runs compiled."""
    assert build_parser().parse_args(command).compile is True
    assert build_parser().parse_args([*command, "--no-compile"]).compile is False
