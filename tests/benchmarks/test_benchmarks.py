"""Smoke test of ``python -m benchmarks``: every row runs and lands in the JSON.

Figures are not checked against targets here (speed is proven by running the
benchmark, never by timing asserts); only that each row produced sane values.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

import pytest

from benchmarks import capacity, sessions
from benchmarks.main import ROW_NAMES, build_parser, compare, table
from benchmarks.stats import median_of
from benchmarks.streams import PacedTimes
from benchmarks.wire import figures_for

REPO = Path(__file__).resolve().parents[2]


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def _summary_ok(summary: dict[str, Any], n: int | None = None) -> bool:
    keys = ("p50", "p95", "p99", "mean", "min", "max")
    ok = all(isinstance(summary[k], float) and math.isfinite(summary[k]) for k in keys)
    return ok and (n is None or summary["n"] == n)


@pytest.mark.slow
def test_every_row_runs_and_is_written(demo_cache_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "benchmarks", "--frames", "5", "--sessions", "5"]
    cmd += ["--zero-cost-frames", "40", "--append-seconds", "1", "--rounds", "1"]
    cmd += ["--concurrent", "1,2", "--json", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stderr[-4000:]
    results = json.loads(out.read_text())
    for name in ROW_NAMES.values():
        assert name in results and "skipped" not in results[name], name
    assert results["machine"]["nproc"] >= 1

    bare = results["bare"]
    assert _summary_ok(bare["step_ms"], 5) and _positive(bare["fps"])
    assert _summary_ok(bare["adapter"]["step_ms"], 5)

    zero = results["zero_cost"]
    assert zero["frames"] == 40 and _positive(zero["fps"]) and _positive(zero["us_per_frame"])
    assert _summary_ok(zero["round_trip_us"], 40)

    paced = results["paced"]
    assert _summary_ok(paced["latency_ms"], 5)
    assert isinstance(paced["overhead_ms"]["p50"], float)
    assert isinstance(paced["target_met"], bool)

    for side in (paced, results["peer"]["paced"]):
        hops = side["breakdown"]["hops_us"]
        assert all(_positive(h["p50"]) for name, h in hops.items() if name.startswith("model"))
        assert isinstance(side["breakdown"]["overhead_us"]["p50"], float)
        # Both servers' ways in split where the append reaches the server.
        assert _positive(hops["client send -> server receive"]["p50"])
    floor = results["ping_floor"]
    assert _summary_ok(floor["back_to_back_us"]) and _summary_ok(floor["paced_us"])

    unpaced = results["unpaced"]
    assert unpaced["frames"] == 5 and _positive(unpaced["fps"])
    assert _positive(unpaced["ratio_to_bare"])

    for resp in (results["responsiveness"], results["peer"]["responsiveness"]):
        assert _positive(resp["pong_ms"]) and _positive(resp["cancel_ms"])
        assert isinstance(resp["frames_after_cancel"], int)
        assert isinstance(resp["deltas_after_cancel"], int)
        assert 0 <= resp["cancelled_frame_index"] <= 13

    churn = results["churn"]
    assert churn["sessions"] == 5 and churn["abrupt"] == 1
    assert _positive(churn["sessions_per_s"]) and _positive(churn["rss_end_mb"])
    # Not a timing assert: the slot must be free after churn, whatever the speed.
    assert churn["slot_free_after"] is True and churn["busy_refusals"] == 0

    assert results["peer"]["rounds"] == 1
    assert _summary_ok(results["peer"]["ours_median"]["paced"]["latency_ms"], 5)
    comparison = results["peer"]["comparison"]
    assert set(comparison) >= {"paced.latency_ms.p50", "unpaced.fps", "responsiveness.pong_ms"}
    for figure in comparison.values():
        assert isinstance(figure["at_least_as_good"], bool) and _positive(figure["peer"])
    per_round = results["peer"]["per_round"]
    assert len(per_round["ours"]) == len(per_round["peer"]) == 1
    assert _positive(per_round["peer"][0]["paced.breakdown.overhead_us.p50"])

    shapes = results["graph"]["shapes"]
    assert [s["shape"] for s in shapes][:2] == ["mlx-vlm B=1", "B=1"]
    assert all(s["waits"] >= 1 and _positive(s["compute"]) for s in shapes)

    printed = done.stdout
    for label in ("1 bare", "2 zero-cost", "3 paced", "4 unpaced", "5 responsive", "6 churn"):
        assert label in printed
    assert "7 vs mlx-vlm" in printed


@pytest.mark.slow
def test_long_start_and_evalshare_scripts_run(demo_cache_dir: Path, tmp_path: Path) -> None:
    """The long-session, session-start and eval-share scripts, cut to a few frames."""
    runs = {
        "long": ["--minutes", "0.02", "--bound", "0.4", "--wire-bound", "0.4"],
        "start": ["--tokens", "0,6", "--rounds", "1", "--repeats", "1", "--no-peer"],
        "evalshare": ["--size", "tiny", "--frames", "3"],
    }
    results: dict[str, Any] = {}
    for name, args in runs.items():
        out = tmp_path / f"{name}.json"
        cmd = [sys.executable, "-m", f"benchmarks.{name}", *args, "--json", str(out)]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        results[name] = json.loads(out.read_text())

    unbounded, bounded = results["long"]["runs"]
    assert unbounded["bound_seconds"] is None and unbounded["renewals"] == 0
    assert unbounded["frames"] == 15 and _positive(unbounded["minutes"][-1]["step_ms_p50"])
    # A 0.4 s bound is 5 frames: mlx-vlm stops there, the script opens a new session.
    assert bounded["renewals"] == 2 and bounded["stops"][0]["session_frames"] == 5
    assert "context limit" in bounded["stops"][0]["error"]
    wire = results["long"]["wire"]
    assert wire["audio_deltas"] == 5 and wire["errors"] == 1
    assert wire["ended_with"] == "response.done"

    start = results["start"]["ours"]["open_ms_p50"]
    assert set(start) == {"0", "6"} and all(_positive(v) for v in start.values())
    share = results["evalshare"]
    assert _positive(share["step_ms_p50"]) and 0 < share["eval_share"] <= 1


def test_row_selection_is_validated() -> None:
    parser = build_parser()
    assert parser.parse_args(["--rows", "3,1"]).rows == (1, 3)
    assert parser.parse_args([]).size == "tiny"
    assert parser.parse_args(["--size", "medium"]).size == "medium"
    with pytest.raises(SystemExit):
        parser.parse_args(["--size", "huge"])
    with pytest.raises(SystemExit):
        parser.parse_args(["--rows", str(max(ROW_NAMES) + 1)])
    with pytest.raises(SystemExit):
        parser.parse_args(["--frames", "0"])


def test_comparison_direction() -> None:
    ours = {
        "paced": {"latency_ms": {"p50": 20.0, "p95": 22.0, "p99": 30.0}},
        "unpaced": {"fps": 50.0},
    }
    peer = {
        "paced": {"latency_ms": {"p50": 25.0, "p95": 21.0, "p99": 30.0}},
        "unpaced": {"fps": 40.0},
    }
    result = compare(ours, peer)
    assert result["paced.latency_ms.p50"]["at_least_as_good"] is True
    assert result["paced.latency_ms.p95"]["at_least_as_good"] is False
    assert result["paced.latency_ms.p99"]["at_least_as_good"] is True
    assert result["unpaced.fps"]["at_least_as_good"] is True
    assert result["unpaced.fps"]["ratio"] == pytest.approx(1.25)


def test_median_of_runs() -> None:
    runs = [{"a": {"x": 1.0, "n": 5}, "s": "one"}, {"a": {"x": 3.0, "n": 5}, "s": "two"}]
    runs.append({"a": {"x": 2.0, "n": 5}, "s": "three"})
    assert median_of(runs) == {"a": {"x": 2.0, "n": 5}, "s": "one"}


def test_table_of_skipped_rows() -> None:
    skipped = {"skipped": "not selected"}
    results = {name: skipped for name in ROW_NAMES.values()}
    printed = table(results)
    assert "row | metric" in printed and "1 bare" not in printed


@pytest.mark.slow
def test_sessions_sweep_runs(demo_cache_dir: Path, tmp_path: Path) -> None:
    """``benchmarks.sessions`` on 2 concurrent conversations of 1 s each under both
    schedulers: every figure is there and sane, and no conversation was refused or failed
    (not a timing assert: whether they stayed real time is the benchmark's finding, not
    the test's)."""
    out = tmp_path / "sessions.json"
    cmd = [sys.executable, "-m", "benchmarks.sessions", "--sessions", "2", "--seconds", "1"]
    cmd += ["--scheduler", "time-sliced,batched", "--json", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["counts"] == [2] and result["schedulers"] == ["time-sliced", "batched"]
    frames = result["frames_per_conversation"]
    assert frames == 12
    for name, flag in (("time-sliced", "--no-batch-frames"), ("batched", "--batch-frames")):
        one = result["by_scheduler"][name]
        assert one["server_options"] == ["--max-sessions", "2", "--admission-margin", "0", flag]
        assert one["max_realtime_sessions"] in (0, 2)
        assert result["max_realtime_sessions"][name] == one["max_realtime_sessions"]
        for n, row in zip((2,), one["by_sessions"], strict=True):
            assert row["sessions"] == n and row["frames"] == n * frames
            assert _summary_ok(row["latency_ms"], n * frames)
            assert len(one["per_round"][0][0]["conversations"]) == n
            assert _positive(row["engine_busy"]) and _positive(row["engine_step_ms_mean"])
            assert _positive(row["step_ms_per_batch"]) and _positive(row["step_ms_per_frame"])
            assert row["model_steps"] >= 1 and row["step_by_rows"]
            if name == "time-sliced" or n == 1:
                assert row["rows_per_step_mean"] == 1 and list(row["step_by_rows"]) == ["1"]
            else:
                assert 1 <= row["rows_per_step_mean"] <= 2
            assert _positive(row["server_cpu_ms_per_frame"]) and _positive(row["wall_seconds"])
            assert isinstance(row["lag_growth_ms_max"], float)
            assert row["client_errors"] == [] and row["refused"] == {}
            assert row["busy_retries"] == 0
            # Every conversation ended the way the benchmark ends it, by a cancel.
            assert row["session_outcomes"] == {"outcome=cancelled": n}
            assert isinstance(row["realtime"], bool)
    assert "largest N with every conversation real time: time-sliced" in done.stdout


@pytest.mark.slow
def test_memory_script_runs(demo_cache_dir: Path, tmp_path: Path) -> None:
    """``benchmarks.memory`` with two sessions of one second of audio each, batched, the
    second starting three frames after the first."""
    out = tmp_path / "memory.json"
    cmd = [sys.executable, "-m", "benchmarks.memory", "--sessions", "2", "--seconds", "1"]
    cmd += ["--sample-seconds", "0.4", "--batched", "--stagger-seconds", "0.24"]
    cmd += ["--json", str(out)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["sessions"] == 2 and result["frames_per_session"] == 12
    assert result["batched"] is True and result["stagger_seconds"] > 0
    assert len(result["opens"]) == 2 and _positive(result["open_ms_p50"])
    assert _positive(result["loaded"]["active_mb"]) and _positive(result["peak_mb"])
    assert len(result["samples"]) == 1 + 3  # after the opens, then every 5 frames, the end
    assert isinstance(result["growth_mb_per_session_minute"], float)
    assert _summary_ok(result["step_ms"], 12 + 3)  # one batched step a round


def _times(latencies_ms: list[float], frame: float = 0.08) -> PacedTimes:
    sent = [i * frame for i in range(len(latencies_ms))]
    received = [s + lat / 1e3 for s, lat in zip(sent, latencies_ms, strict=True)]
    return PacedTimes(sent=sent, received=received, late=[0.0] * len(sent))


def test_sessions_verdict_per_conversation() -> None:
    """Real time: p95 within two frames, lag not growing by a frame, every frame back."""
    steady = sessions.conversation_figures(_times([30.0] * 100), 100, 80.0)
    assert steady["realtime"] is True and steady["missed_frames"] == 0
    assert steady["lag_growth_ms"] == pytest.approx(0.0, abs=1e-6)
    assert steady["outstanding_max"] == 0
    # 1 ms later every frame: fell 99 ms behind over the run, though p95 is < 160 ms.
    growing = sessions.conversation_figures(_times([1.0 * i for i in range(100)]), 100, 80.0)
    assert growing["realtime"] is False
    assert growing["lag_growth_ms"] == pytest.approx(99.0)
    assert growing["latency_ms"]["p95"] < 160 and growing["outstanding_end"] == 1
    slow = sessions.conversation_figures(_times([200.0] * 100), 100, 80.0)
    assert slow["realtime"] is False and slow["missed_frames"] == 100
    short = sessions.conversation_figures(_times([30.0] * 90), 100, 80.0)
    assert short["realtime"] is False and short["answered"] == 90


def test_sessions_headline_and_counts() -> None:
    rows = [{"sessions": n, "realtime": ok} for n, ok in ((1, True), (2, True), (3, False))]
    assert sessions.headline(rows) == 2
    assert sessions.headline([{"sessions": 1, "realtime": False}]) == 0
    # Counting up: a pass after a failure (noise) does not raise the headline.
    assert sessions.headline([*rows, {"sessions": 4, "realtime": True}]) == 2
    assert sessions.session_counts("4,1,2,2") == (1, 2, 4)
    assert sessions.scheduler_names("batched, time-sliced,batched") == ("batched", "time-sliced")
    for bad_names in ("", "fast", "batched,fast"):
        with pytest.raises(argparse.ArgumentTypeError):
            sessions.scheduler_names(bad_names)
    for bad in ("0,1", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            sessions.session_counts(bad)
    assert build_parser().parse_args(["--concurrent", "2,1"]).concurrent == (1, 2)


def test_sessions_step_figures_per_batch_and_per_conversation_frame() -> None:
    """From ``realtime_batch_step_seconds`` by rows: four 1-row steps of 30 ms and two
    3-row steps of 40 ms are 6 steps of 10 frames, 33.3 ms a batch, 20 ms a frame."""
    name = "realtime_batch_step_seconds"
    before = {f"{name}_count{{rows=1}}": 1.0, f"{name}_sum{{rows=1}}": 0.03}
    after = {
        f"{name}_count{{rows=1}}": 5.0,
        f"{name}_sum{{rows=1}}": 0.15,
        f"{name}_count{{rows=3}}": 2.0,
        f"{name}_sum{{rows=3}}": 0.08,
    }
    figures = sessions.step_figures(before, after)
    assert figures["model_steps"] == 6 and figures["rows_per_step_mean"] == pytest.approx(10 / 6)
    assert figures["step_ms_per_batch"] == pytest.approx(200 / 6)
    assert figures["step_ms_per_frame"] == pytest.approx(20.0)
    assert figures["step_by_rows"] == {
        "1": {
            "steps": 4.0,
            "ms_per_batch": pytest.approx(30.0),
            "ms_per_frame": pytest.approx(30.0),
        },
        "3": {
            "steps": 2.0,
            "ms_per_batch": pytest.approx(40.0),
            "ms_per_frame": pytest.approx(40 / 3),
        },
    }
    assert sessions.step_figures({}, {})["step_ms_per_batch"] is None


def test_accelerator_parts_join_back_only_when_all_are_there(tmp_path: Path) -> None:
    """benchmarks/accelerator.sh: wheels packed into parts (each device call carries at
    most 64 MiB), stashed call by call, joined and checked; a missing or stale part is a
    clear error, exit 2 or a failed digest, never a half-installed machine."""
    repo = tmp_path / "repo"
    (repo / "benchmarks").mkdir(parents=True)
    script = repo / "benchmarks" / "accelerator.sh"
    script.write_bytes((REPO / "benchmarks" / "accelerator.sh").read_bytes())
    wheels = repo / ".accelerator" / "wheels"
    wheels.mkdir(parents=True)
    payload = bytes(range(256)) * 40
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(payload)
    (wheels / "b-2.0-py3-none-any.whl").write_bytes(payload[::-1])
    stash = tmp_path / "stash"
    env = {"PATH": "/usr/bin:/bin", "ACCELERATOR_STASH": str(stash)}

    def call(verb: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(script), verb],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert call("pack", ACCELERATOR_PART_BYTES="8k").returncode == 0
    parts = sorted(p for p in (repo / ".accelerator").iterdir() if p.is_dir())
    assert len(parts) >= 3 and all((p / "part").stat().st_size <= 8192 for p in parts)
    # The device gets one part a call; the others are not there.
    aside = tmp_path / "aside"
    aside.mkdir()
    for part in parts[1:]:
        part.rename(aside / part.name)
    assert call("stash").returncode == 0
    missing = call("join")
    assert missing.returncode == 2 and "part 2 of" in missing.stderr
    for part in parts[1:]:
        (aside / part.name).rename(part)
    assert call("join").returncode == 0, call("join").stderr
    assert (stash / "wheels" / "a-1.0-py3-none-any.whl").read_bytes() == payload
    # A part from another prepare fails its digest.
    (parts[0] / "part").write_bytes(b"x" + (parts[0] / "part").read_bytes()[1:])
    assert call("join").returncode != 0
    usage = call("nonsense")
    assert usage.returncode == 2 and "usage" in usage.stderr


@pytest.mark.slow
def test_start_states_rows_run(demo_cache_dir: Path, tmp_path: Path) -> None:
    """``benchmarks.start --states``: cold, cached, warmed and voice-stored opens."""
    out = tmp_path / "states.json"
    cmd = [sys.executable, "-m", "benchmarks.start", "--states", "--tokens", "0,6"]
    done = subprocess.run(
        [*cmd, "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["tokens"] for r in rows] == [0, 6]
    assert rows[1]["bytes"] > 0 and _positive(rows[1]["cold_s"]) and _positive(rows[1]["mlx_vlm_s"])
    assert rows[1]["voice_stored_s"] is None or _positive(rows[1]["voice_stored_s"])


PNG: Final = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_capacity_sweep_runs(demo_cache_dir: Path, tmp_path: Path) -> None:
    """``benchmarks.capacity`` at 1 and 2 conversations of 4 s (a turn each), mlx-vlm's
    server beside it: every figure of a count is there, the sweep stops at the first count that fell
    behind, and the plot is a PNG (whether a count kept real time is the benchmark's
    finding, not the test's)."""
    out, png = tmp_path / "capacity.json", tmp_path / "capacity.png"
    cmd = [sys.executable, "-m", "benchmarks.capacity", "--sessions", "1,2", "--seconds", "4"]
    cmd += ["--json", str(out), "--plot", str(png)]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["served"] == "built-in demo (its turns)"
    assert result["frames_per_conversation"] == 50 and result["seconds"] == pytest.approx(4.0)
    rows = result["rows"]
    assert result["counts"] == [row["sessions"] for row in rows]
    # Counting up, the sweep stops at the first count that fell behind.
    assert result["counts"] == ([1] if not rows[0]["realtime"] else [1, 2])
    assert result["max_realtime_sessions"] == sessions.headline(rows)
    for row in [*rows, result["peer"]]:
        # One turn a conversation: its answer, when it came within the silence, timed.
        turns = row["sessions"]
        assert row["turns"] == turns and 0 <= row["unanswered_turns"] <= turns
        answered = turns - row["unanswered_turns"]
        if answered:
            assert _summary_ok(row["first_audio_ms"], answered)
        assert 0 <= row["late_share"] <= 1 and isinstance(row["realtime"], bool)
        assert _positive(row["latency_ms_p50"]) and _positive(row["latency_ms_p95"])
    for row in rows:
        assert 0 < row["engine_busy"] <= 1.5
        assert row["detail"]["client_errors"] == [] and row["detail"]["refused"] == {}
    assert result["peer"]["engine_busy"] is None and result["peer"]["errors"] == []
    assert png.read_bytes().startswith(PNG)
    assert "largest N in real time:" in done.stdout and "mlx-vlm | 1" in done.stdout


def test_capacity_script_and_first_audio() -> None:
    """Turns of speech then silence; the first audio is the first loud delta after a
    turn's last speech append, within its silence, timed from that append."""
    figures = figures_for(None)
    frame = figures.frame_seconds
    speak = round(capacity.SPEAK_SECONDS / frame)
    listen = round(capacity.LISTEN_SECONDS / frame)
    frames = 2 * (speak + listen) + speak + 3
    one = capacity.script(frames, figures, seed=1)
    assert len(one.messages) == frames and one.listen_frames == listen
    # The third turn's silence is cut by the run's end: no answer looked for.
    assert one.turn_ends == (speak - 1, 2 * speak + listen - 1)
    assert capacity.doubling(10) == (1, 2, 4, 8) and capacity.doubling(1) == (1,)

    sent = [i * frame for i in range(frames)]
    received = [t + 0.03 for t in sent]
    levels = [-100.0] * frames
    levels[speak + 7] = -20.0  # the first turn's answer, 8 frames after its stop
    levels[speak + 8] = -20.0
    times = PacedTimes(sent=sent, received=received, levels=levels)
    first, second = capacity.first_audio_ms(times, one)
    assert first == pytest.approx(8 * frame * 1e3 + 30) and second is None
    # Deltas that never came: no answer, not an error.
    cut = PacedTimes(sent=sent, received=received[:speak], levels=levels[:speak])
    assert capacity.first_audio_ms(cut, one) == [None, None]


def _capacity_row(n: int, realtime: bool, peer: bool = False) -> dict[str, Any]:
    return {
        "sessions": n,
        "realtime": realtime,
        "turns": 3 * n,
        "unanswered_turns": 0,
        "first_audio_ms": {"p50": 600.0 + n, "p95": 700.0 + 10 * n},
        "late_share": 0.0 if realtime else 0.3,
        "latency_ms_p50": 30.0 * n,
        "latency_ms_p95": 50.0 * n,
        "engine_busy": None if peer else 0.2 * n,
    }


def test_capacity_table_and_plot(tmp_path: Path) -> None:
    """The table and the PNG from a sweep's figures, with and without mlx-vlm's row."""
    result: dict[str, Any] = {
        "served": "built-in demo (its turns)",
        "date": "2026-12-07T05:00:00+00:00",
        "machine": {"nproc": 2, "cpu": "a CPU", "mlx": "0.32.4"},
        "seconds": 12.0,
        "frame_ms": 80.0,
        "criterion": sessions.criterion(80.0),
        "rows": [_capacity_row(1, True), _capacity_row(2, True), _capacity_row(4, False)],
        "max_realtime_sessions": 2,
        "peer": _capacity_row(1, True, peer=True),
    }
    printed = capacity.table(result)
    assert "ours    | 4 | 604 / 740" in printed and "mlx-vlm | 1" in printed
    assert "largest N in real time: 2" in printed
    capacity.plot(result, tmp_path / "with-peer.png")
    result["peer"] = {"skipped": "--no-peer"}
    assert "mlx-vlm: skipped (--no-peer)" in capacity.table(result)
    capacity.plot(result, tmp_path / "alone.png")
    # --replot draws a saved sweep again, measuring nothing; a file that is not one is
    # a clear error, exit 2.
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(result))
    assert capacity.main(["--replot", str(saved), "--plot", str(tmp_path / "again.png")]) == 0
    for name in ("with-peer.png", "alone.png", "again.png"):
        assert (tmp_path / name).read_bytes().startswith(PNG)
    saved.write_text("{}")
    assert capacity.main(["--replot", str(saved), "--plot", str(tmp_path / "no.png")]) == 2
    assert not (tmp_path / "no.png").exists()


@pytest.mark.slow
def test_start_second_start_row_runs(demo_cache_dir: Path, tmp_path: Path) -> None:
    """``benchmarks.start --second-start``: a fresh server opens a never-seen prompt
    with nothing on disk; a first start builds the chain ahead and writes it, a second
    process reads it and opens a never-seen prompt, by each read."""
    out = tmp_path / "second.json"
    cmd = [sys.executable, "-m", "benchmarks.start", "--second-start", "--ahead", "12"]
    done = subprocess.run(
        [*cmd, "--chars", "8", "--prefill", "sequence:4", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["build"]["voice_chain_tokens"] == 12 and result["build"]["files_bytes"] > 0
    opened = result["open"]
    assert opened["disk_reads"] == 1 and opened["tokens"] <= 12
    assert _positive(opened["per_token_frames"])
    fresh = result["fresh"]
    assert fresh["disk_reads"] == 0 and _positive(fresh["per_token_frames"])
    assert fresh["voice_chain_tokens"] == fresh["tokens"]  # extended as it read
    sequence = result["open_sequence"]
    assert sequence["prefill"] == "sequence:4" and sequence["disk_reads"] == 1
    assert _positive(sequence["per_token_frames"])


@pytest.mark.slow
def test_prefill_benchmark_runs(demo_cache_dir: Path, tmp_path: Path) -> None:
    """``benchmarks.prefill``: the two reads' difference, speed and graph terms, each
    part at its smallest."""
    out = tmp_path / "prefill.json"
    cmd = [sys.executable, "-m", "benchmarks.prefill", "--prompts", "1", "--frames", "2"]
    cmd += ["--tokens", "12", "--rounds", "1", "--graph-tokens", "8", "--chunk", "4"]
    done = subprocess.run(
        [*cmd, "--json", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["chunk"] == 4
    graph = result["graph"]
    assert graph["step"]["waits_per_token"] == 0.25  # four steps a wait
    assert graph["sequence"]["waits_per_token"] == 0.25  # a chunk of four a wait
    assert graph["sequence"]["compute_per_token"] < graph["step"]["compute_per_token"]
    (speed,) = result["speed"]
    assert speed["tokens"] == 12 and _positive(speed["speedup"])
    assert (result["difference"]["misses"], result["difference"]["hits"]) == (2, 0)
    (row,) = result["difference"]["rows"]
    assert row["text"]["n"] == 2 and row["audio_codes"]["n"] >= 1
    assert "| prompt |" in done.stdout
