"""``python -m benchmarks.capacity``: how many spoken conversations one server carries,
as a table, JSON (``--json``) and a plot (``--plot``, a PNG).

Conversations 1, 2, 4, 8, ... (up to ``--max-sessions``, or the ``--sessions`` given) on
one ``realtime serve``, counting up until the first count that falls behind real time
(``benchmarks.sessions``' criterion: a conversation's p95 over two frame times, its lag
growing by a frame over the run, or a frame never answered). Each conversation is a
real-time paced client taking turns: :data:`SPEAK_SECONDS` of speech-like audio, then
:data:`LISTEN_SECONDS` of silence in which the answer comes, again and again for
``--seconds``, every conversation with its own voice and seed. Per count:

* **time to first audio**: from the append that carried a turn's last frame of speech
  leaving the client (the user stops) to the first audio delta after it with sound in it
  (louder than :data:`ANSWER_DB`), p50 and p95 over every turn of every conversation,
  and the turns that got no answer before the next one began;
* **late frames**: the share of frames whose audio came back more than two frame times
  after their append (the frame missed its slot);
* **frame latency** p50 / p95 (append to that frame's audio delta);
* **engine busy**: the share of wall time the engine spent in model steps (the server's
  ``/metrics``).

Without ``--model`` the server is the built-in demo (tiny), whose turn policy answers
speech after the user stops (``realtime.demo.turns``: about 560 ms of quiet ends a
turn); with ``--model`` the checkpoint decides its turns itself. Beside the sweep,
mlx-vlm's own server (``python -m mlx_vlm.server``) runs one conversation of the same
script on the same checkpoint (``--no-peer``: not). It runs the checkpoint's raw network,
which on random weights makes noise on every frame, so its time to first audio is only
its next frame after the stop; it keeps no ``/metrics``, so its engine share is unknown.

The measuring is ``benchmarks.sessions``' (one ``run_count`` per count) and
``benchmarks.streams``' paced client; servers are ``benchmarks.servers``'.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import numpy as np
import trio

from benchmarks import servers, sessions, streams
from benchmarks.bare import WARMUP_FRAMES
from benchmarks.common import checkpoint_parser, model_path, write_json
from benchmarks.stats import command_line, machine, summarize
from benchmarks.streams import PacedTimes
from benchmarks.wire import (
    BenchError,
    connect,
    figures_for,
    frame_messages,
    speech_pcm,
)
from realtime.models.base import ModelFigures

SPEAK_SECONDS: Final = 0.8
"""Each turn's speech, a short question: long enough for a turn detector to open a turn
(the demo's needs 240 ms), short enough for several turns a run."""
LISTEN_SECONDS: Final = 3.2
"""Each turn's silence after it: the demo's answer (about 30 tokens, a frame each)
begins about 560 ms after the user stops and is over within it."""
ANSWER_DB: Final = -60.0
"""An audio delta louder than this carries the answer's sound (the demo sends digital
silence, -100 dBFS, outside its answers)."""
VOICE_SEED: Final = 200
"""Conversation k speaks ``speech_pcm(seed=VOICE_SEED + k)`` with model seed ``k + 1``."""
GIVE_UP_SECONDS: Final = 3.0
"""A count's run stops once a conversation has this much audio unanswered: it has
fallen behind already, and its backlog would only take longer to drain."""
MAX_SESSIONS: Final = 64


def doubling(top: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to ``top``."""
    counts: list[int] = []
    n = 1
    while n <= top:
        counts.append(n)
        n *= 2
    return tuple(counts)


@attrs.frozen
class Script:
    """One conversation's appends and where its turns end."""

    messages: list[str]
    turn_ends: tuple[int, ...]
    """Index of each turn's last append of speech (the user stops as it goes out)."""
    listen_frames: int
    """Frames of silence after each turn: the window its answer is looked for in."""


def script(frames: int, figures: ModelFigures, seed: int) -> Script:
    """``frames`` appends of turns: speech for :data:`SPEAK_SECONDS`, silence for
    :data:`LISTEN_SECONDS`, repeated; the run ends where ``frames`` does, and only turns
    whose silence it holds whole count (four seconds a turn at VoiceChat's 80 ms)."""
    size, rate = figures.frame_samples, figures.input_sample_rate
    speak = max(1, round(SPEAK_SECONDS / figures.frame_seconds))
    listen = max(1, round(LISTEN_SECONDS / figures.frame_seconds))
    turns = -(-frames // (speak + listen))
    pcm = np.zeros(turns * (speak + listen) * size, dtype=np.int16)
    voice = speech_pcm(turns * speak * size, rate, seed)
    ends = []
    for turn in range(turns):
        first = turn * (speak + listen)
        pcm[first * size : (first + speak) * size] = voice[turn * speak * size :][: speak * size]
        ends.append(first + speak - 1)
    messages = frame_messages(pcm[: frames * size], figures)
    return Script(messages, tuple(e for e in ends if e + listen < frames), listen)


def first_audio_ms(times: PacedTimes, conversation: Script) -> list[float | None]:
    """Per turn: ms from its last append of speech leaving the client to the first audio
    delta after it louder than :data:`ANSWER_DB`, within its silence (None: no answer
    there, or the run stopped first)."""
    levels = times.levels or []
    out: list[float | None] = []
    for end in conversation.turn_ends:
        found = None
        window = range(end + 1, min(end + 1 + conversation.listen_frames, len(levels)))
        for i in window:
            if levels[i] > ANSWER_DB and i < len(times.received) and end < len(times.sent):
                found = (times.received[i] - times.sent[end]) * 1e3
                break
        out.append(found)
    return out


def _answers(values: Sequence[float | None]) -> dict[str, Any]:
    got = [v for v in values if v is not None]
    return {
        "turns": len(values),
        "unanswered_turns": len(values) - len(got),
        "first_audio_ms": summarize(got).to_dict(),
    }


def count_row(
    sweep_row: dict[str, Any], times: Sequence[PacedTimes], scripts: Sequence[Script]
) -> dict[str, Any]:
    """One count's figures: the four the plot shows, then ``benchmarks.sessions``' row
    (its per-conversation detail left out)."""
    answers = [a for t, s in zip(times, scripts, strict=False) for a in first_audio_ms(t, s)]
    latency = sweep_row["latency_ms"]
    return {
        "sessions": sweep_row["sessions"],
        "realtime": sweep_row["realtime"],
        **_answers(answers),
        "late_share": sweep_row["missed_fraction"],
        "latency_ms_p50": latency["p50"],
        "latency_ms_p95": latency["p95"],
        "engine_busy": sweep_row["engine_busy"],
        "detail": {k: v for k, v in sweep_row.items() if k != "conversations"},
    }


async def peer_row(
    server: servers.ServerProcess, model: str, conversation: Script, warm: list[str]
) -> dict[str, Any]:
    """One conversation of the script on mlx-vlm's server, after a warm-up session (it
    loads the model on the first), read the way :func:`count_row` reads ours."""
    await streams.warm_up(server.url, model, warm)
    times = PacedTimes(levels=[])
    errors: list[str] = []
    started = time.perf_counter()
    cpu_before = server.cpu_seconds()
    async with connect(server.url, model) as client:
        await client.configure(seed=1, within=streams.STREAM_TIMEOUT)
        frame_ms = client.conn.frame_seconds * 1e3
        try:
            await streams.paced_stream(client, conversation.messages, times=times)
        except Exception as exc:  # recorded: what it got so far is still read
            errors.append(f"{type(exc).__name__}: {exc}"[:500])
        await streams.cancel_and_close(client)
    cpu_after = server.cpu_seconds()
    wall = time.perf_counter() - started
    figures = sessions.conversation_figures(times, len(conversation.messages), frame_ms)
    answered = figures["answered"]
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return {
        "sessions": 1,
        "realtime": figures["realtime"] and not errors,
        **_answers(first_audio_ms(times, conversation)),
        "late_share": figures["missed_frames"] / answered if answered else None,
        "latency_ms_p50": figures["latency_ms"]["p50"],
        "latency_ms_p95": figures["latency_ms"]["p95"],
        "engine_busy": None,
        "server_cpu_cores": cpu / wall if cpu is not None and wall > 0 else None,
        "errors": errors,
        "detail": figures,
    }


def _log(message: str) -> None:
    print(f"capacity: {message}", file=sys.stderr, flush=True)


def sweep(
    path: Path,
    served: Path | None,
    counts: Sequence[int],
    seconds: float,
    *,
    peer: bool = True,
    give_up_seconds: float = GIVE_UP_SECONDS,
    budget_seconds: float = 0.0,
    log: sessions.Log = _log,
) -> dict[str, Any]:
    """``counts`` in order on one server (``served``: its ``-m``, None for the built-in
    demo) until the first that falls behind, or until ``budget_seconds`` have passed
    (0: no bound) before the next count, then mlx-vlm's server on ``path`` at one."""
    started = time.perf_counter()
    figures = figures_for(path)
    frames = max(1, round(seconds * figures.frames_per_second))
    top = max(counts)
    scripts = [script(frames, figures, VOICE_SEED + k) for k in range(top)]
    warm = scripts[0].messages[: WARMUP_FRAMES + round(1 / figures.frame_seconds)]
    options = ("--max-sessions", str(top), "--admission-margin", "0")
    rows: list[dict[str, Any]] = []
    stopped: list[str] = []
    with servers.ours(served, *options) as server:

        async def run_all() -> None:
            await streams.warm_up(server.url, None, warm)
            for n in counts:
                if budget_seconds and time.perf_counter() - started > budget_seconds:
                    stopped.append(f"the {budget_seconds:g} s budget was spent before N={n}")
                    log(stopped[-1])
                    break
                await sessions.wait_idle(server.http)
                log(f"{n} conversations x {frames * figures.frame_seconds:g} s")
                times = [PacedTimes(levels=[]) for _ in range(n)]
                messages = [s.messages for s in scripts[:n]]
                got = await sessions.run_count(server, n, messages, give_up_seconds, times)
                row = count_row(got, times, scripts[:n])
                rows.append(row)
                log(f"  {_line(row)}")
                if not row["realtime"]:
                    break

        trio.run(run_all)
        # The demo's own warning that it is the demo is no problem of the run.
        problems = [
            line
            for line in sessions.server_problems(server.output())
            if "built-in DEMO" not in line
        ]
    result: dict[str, Any] = {
        "served": "built-in demo (its turns)" if served is None else str(served),
        "server_options": list(options),
        "counts": [row["sessions"] for row in rows],
        "seconds": frames * figures.frame_seconds,
        "frames_per_conversation": frames,
        "frame_ms": figures.frame_seconds * 1e3,
        "script": {
            "speak_seconds": SPEAK_SECONDS,
            "listen_seconds": LISTEN_SECONDS,
            "answer_db": ANSWER_DB,
        },
        "give_up_seconds": give_up_seconds,
        "criterion": sessions.criterion(figures.frame_seconds * 1e3),
        "rows": rows,
        "max_realtime_sessions": sessions.headline(rows),
        "fell_behind_at": next((r["sessions"] for r in rows if not r["realtime"]), None),
        "stopped_early": stopped[0] if stopped else None,
        "server_log_problems": problems,
    }
    if peer:
        log("mlx-vlm's server, 1 conversation")
        try:
            with servers.peer(path) as server:
                result["peer"] = trio.run(peer_row, server, str(path), scripts[0], warm)
        except (BenchError, OSError, RuntimeError, trio.TooSlowError) as exc:
            result["peer"] = {"skipped": f"{type(exc).__name__}: {exc}"[:500]}
        if "skipped" not in result["peer"]:
            log(f"  {_line(result['peer'])}")
    else:
        result["peer"] = {"skipped": "--no-peer"}
    return result


# --- the table and the plot ---------------------------------------------------------------


def _f(value: Any, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    return f"{value:.{digits}f}"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _line(row: dict[str, Any]) -> str:
    first = row["first_audio_ms"]
    return (
        f"N={row['sessions']}: first audio p50/p95 {_f(first['p50'])}/{_f(first['p95'])} ms, "
        f"late {_pct(row['late_share'])}, frame p50/p95 {_f(row['latency_ms_p50'])}/"
        f"{_f(row['latency_ms_p95'])} ms, engine busy {_pct(row['engine_busy'])}, "
        f"real time: {row['realtime']}"
    )


HEADERS: Final = (
    "server",
    "N",
    "first audio ms p50 / p95",
    "unanswered turns",
    "late frames",
    "frame ms p50 / p95",
    "engine busy",
    "real time",
)


def table(result: dict[str, Any]) -> str:
    """The sweep and the peer as a table."""
    lines = []
    peer = result["peer"]
    named = [("ours", row) for row in result["rows"]]
    if "skipped" not in peer:
        named.append(("mlx-vlm", peer))
    for name, row in named:
        first = row["first_audio_ms"]
        lines.append(
            (
                name,
                str(row["sessions"]),
                f"{_f(first['p50'])} / {_f(first['p95'])}",
                f"{row['unanswered_turns']} / {row['turns']}",
                _pct(row["late_share"]),
                f"{_f(row['latency_ms_p50'])} / {_f(row['latency_ms_p95'])}",
                _pct(row["engine_busy"]),
                "yes" if row["realtime"] else "NO",
            )
        )
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(HEADERS)]
    out = [" | ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    out.append("-+-".join("-" * w for w in widths))
    out += [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    out.append("")
    out.append(
        f"largest N in real time: {result['max_realtime_sessions']} ({result['criterion']}; "
        f"{result['seconds']:g} s per N)"
    )
    if result.get("stopped_early"):
        out.append(f"stopped early: {result['stopped_early']}")
    if "skipped" in peer:
        out.append(f"mlx-vlm: skipped ({peer['skipped']})")
    return "\n".join(line.rstrip() for line in out)


def plot(result: dict[str, Any], path: Path) -> None:
    """Four panels against the conversation count (ours a line, mlx-vlm's server a
    point at one): time to first audio, frame latency, late frames, engine busy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    peer = result["peer"] if "skipped" not in result["peer"] else None
    n = [row["sessions"] for row in rows]
    frame_ms = result["frame_ms"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharex=True)
    panels = (
        (axes[0][0], "time to first audio after the user stops (ms)", "first_audio_ms", 1.0),
        (axes[0][1], "frame latency: append to its audio (ms)", "latency_ms", 1.0),
        (axes[1][0], "frames late, over 2 frame times (%)", "late_share", 100.0),
        (axes[1][1], "engine busy (% of wall time)", "engine_busy", 100.0),
    )
    for ax, title, key, scale in panels:
        ax.set_title(title, fontsize=10)
        if key in ("first_audio_ms", "latency_ms"):
            for q, style in (("p50", "o-"), ("p95", "s--")):
                values = [_value(row, key, q) for row in rows]
                ax.plot(n, values, style, color="tab:blue", label=f"this server, {q}")
                if peer is not None:
                    ax.plot(
                        [1], [_value(peer, key, q)], style[0], color="tab:orange", markersize=9,
                        label=f"mlx-vlm's server, {q}",
                    )  # fmt: skip
            if key == "first_audio_ms" and peer is not None:
                ax.annotate(
                    "mlx-vlm: its raw network's\nnext frame after the stop,\nnot a turn's answer",
                    (1, _value(peer, key, "p50")), textcoords="offset points", xytext=(12, -4),
                    fontsize=7, color="tab:orange", va="top",
                )  # fmt: skip
            if key == "latency_ms":
                ax.axhline(2 * frame_ms, color="grey", lw=0.8, ls=":", label="2 frame times")
            ax.legend(fontsize=8)
        else:
            values = [_scaled(row[key], scale) for row in rows]
            ax.plot(n, values, "o-", color="tab:blue", label="this server")
            if peer is not None and peer[key] is not None:
                ax.plot([1], [peer[key] * scale], "o", color="tab:orange", label="mlx-vlm's server")
            ax.set_ylim(bottom=0, top=max(105.0, *(v for v in values if v == v)))
            ax.legend(fontsize=8)
        ax.set_ylim(bottom=0)
        for row in rows:
            if not row["realtime"]:
                ax.axvspan(row["sessions"] / 1.3, row["sessions"] * 1.3, color="red", alpha=0.08)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(x) for x in n])
        ax.set_xlabel("conversations at once (red: fell behind real time)")
    fig.suptitle(_caption(result), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _value(row: dict[str, Any], key: str, q: str) -> float:
    value = row["first_audio_ms"][q] if key == "first_audio_ms" else row[f"latency_ms_{q}"]
    return float("nan") if value is None else float(value)


def _scaled(value: float | None, scale: float) -> float:
    return float("nan") if value is None else value * scale


def _caption(result: dict[str, Any]) -> str:
    m = result.get("machine", {})
    load = ""
    if result.get("load_average_start") is not None:
        load = f", load average {result['load_average_start']} -> {result.get('load_average_end')}"
    return (
        f"python -m benchmarks.capacity, {result.get('date', '')}: {result['served']}; "
        f"{m.get('nproc')} CPUs, {m.get('cpu')}, mlx {m.get('mlx')}{load}\n"
        f"{result['seconds']:g} s a count, turns of {SPEAK_SECONDS:g} s speech + "
        f"{LISTEN_SECONDS:g} s silence; largest N in real time: "
        f"{result['max_realtime_sessions']}"
    )


# --- the command ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = checkpoint_parser(
        "benchmarks.capacity",
        __doc__,
        model_help="checkpoint folder (default: the built-in demo, tiny, with its turns)",
        size_help="without --model: only tiny (the built-in demo's turns run on it)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=30.0,
        help="audio each conversation streams per count (default %(default)s)",
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=MAX_SESSIONS,
        help="the sweep's last count, 1, 2, 4, ... up to it (default %(default)s)",
    )
    parser.add_argument(
        "--sessions",
        type=sessions.session_counts,
        help="the counts to sweep instead of the doubling, e.g. 1,2,3",
    )
    parser.add_argument(
        "--give-up-seconds",
        type=float,
        default=GIVE_UP_SECONDS,
        help="stop a count's run once a conversation has this much audio unanswered "
        "(0: never; default %(default)s)",
    )
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=0.0,
        help="start no further count once the sweep has run this long (0: no bound; "
        "default %(default)s)",
    )
    parser.add_argument("--no-peer", action="store_true", help="skip mlx-vlm's server")
    parser.add_argument(
        "--replot",
        type=Path,
        metavar="JSON",
        help="measure nothing: print the table of a sweep's --json file and draw its plot",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=Path("capacity.png"),
        help="write the plot here, a PNG (default %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.max_sessions < 1:
        parser.error("--seconds must be > 0 and --max-sessions >= 1")
    if args.replot is not None:
        try:
            saved = json.loads(args.replot.read_text())
            print(table(saved))
            plot(saved, args.plot)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {args.replot} is not a capacity sweep's JSON: {exc}", file=sys.stderr)
            return 2
        _log(f"wrote {args.plot}")
        return 0
    if args.model is None and args.size != "tiny":
        parser.error("the built-in demo's turns run on tiny only: give --model for another")
    path = model_path(args)
    counts = args.sessions or doubling(args.max_sessions)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": command_line("benchmarks.capacity", argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": str(path),
        "load_average_start": sessions.load_average(),
    }
    served = None if args.model is None else path
    results.update(
        sweep(
            path,
            served,
            counts,
            args.seconds,
            peer=not args.no_peer,
            give_up_seconds=args.give_up_seconds,
            budget_seconds=args.budget_seconds,
        )
    )
    results["load_average_end"] = sessions.load_average()
    results["elapsed_seconds"] = time.perf_counter() - started
    results["plot"] = str(args.plot)
    m = results["machine"]
    print(f"{results['command']}  ({results['date']})")
    print(
        f"{m.get('nproc')} CPUs, {m.get('cpu')}; mlx {m.get('mlx')}; load average "
        f"{results['load_average_start']} -> {results['load_average_end']}"
    )
    print(f"served: {results['served']}; model: {path}\n")
    print(table(results))
    plot(results, args.plot)
    write_json(args.json, results)
    _log(f"wrote {args.plot}" + (f" and {args.json}" if args.json is not None else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
