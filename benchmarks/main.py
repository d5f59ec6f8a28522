"""``python -m benchmarks``: every row, one server at a time, a table and JSON.

Rows: 1 bare model, 2 zero-cost model through the server, 3 paced stream,
4 unpaced stream, 5 ping/cancel during a long append, 6 session churn and
memory, 7 rows 3-5 against mlx-vlm's own ``/v1/realtime`` server, 8 a short sweep of
concurrent paced conversations on one server (``python -m benchmarks.sessions``), 9 the
frame step's exact counts: waits, graph nodes, casts (``python -m benchmarks.graph``).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import shlex
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import trio

from benchmarks import breakdown, graph, servers, sessions, streams
from benchmarks.bare import WARMUP_FRAMES, bare_model
from benchmarks.common import checkpoint_parser, write_json
from benchmarks.stats import machine, median_of
from benchmarks.wire import (
    append_message,
    figures_for,
    frame_messages,
    pcm_to_float,
    test_pcm,
)

ROW_NAMES: Final = {
    1: "bare",
    2: "zero_cost",
    3: "paced",
    4: "unpaced",
    5: "responsiveness",
    6: "churn",
    7: "peer",
    8: "sessions",
    9: "graph",
}
ALL_ROWS: Final = tuple(ROW_NAMES)
MODEL_ROWS: Final = (1, 3, 4, 5, 7, 8, 9)
"""The default rows when ``--model`` names a checkpoint (rows that measure a model)."""

OVERHEAD_TARGET_MS: Final = 1.0
UNPACED_TARGET_RATIO: Final = 0.97

T = TypeVar("T")


def _rows(text: str) -> tuple[int, ...]:
    try:
        rows = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected row numbers like 1,3,5; got {text!r}") from None
    if not rows or any(r not in ROW_NAMES for r in rows):
        raise argparse.ArgumentTypeError(f"rows are 1..{len(ROW_NAMES)}; got {text!r}")
    return rows


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected an integer > 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = checkpoint_parser(
        "benchmarks",
        __doc__,
        model_help="VoiceChat checkpoint folder for rows 1, 3-5, 7, 8 "
        "(default: the demo checkpoint)",
        size_help="without --model: the demo checkpoint preset (medium: a step is mostly native "
        "compute, as on a real checkpoint; default %(default)s)",
    )
    parser.add_argument(
        "--frames",
        type=_positive,
        default=125,
        help="frames for the bare, paced and unpaced rows (default %(default)s = 10 s)",
    )
    parser.add_argument("--rows", type=_rows, help="rows to run, e.g. 1,3,5 (default: all)")
    parser.add_argument("--no-peer", action="store_true", help="skip row 7 (mlx-vlm's server)")
    parser.add_argument(
        "--sessions", type=_positive, default=200, help="row 6 sessions (default %(default)s)"
    )
    parser.add_argument(
        "--abrupt-every",
        type=int,
        default=5,
        help="row 6: every Nth session drops its TCP stream (0: none; default %(default)s)",
    )
    parser.add_argument(
        "--append-seconds",
        type=float,
        default=8.0,
        help="row 5: length of the one big append (default %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=_positive,
        default=3,
        help="row 7: alternate this server and mlx-vlm's this many times; medians are "
        "compared, so load from elsewhere on the machine hits both (default %(default)s)",
    )
    parser.add_argument(
        "--no-breakdown",
        action="store_true",
        help="skip the per-hop breakdown on instrumented servers (rows 3 and 7)",
    )
    parser.add_argument(
        "--concurrent",
        type=sessions.session_counts,
        default=(1, 2, 3),
        help="row 8: concurrent conversation counts, each streaming --frames frames "
        "(default 1,2,3; python -m benchmarks.sessions for the full sweep)",
    )
    parser.add_argument(
        "--zero-cost-frames",
        type=_positive,
        help="row 2 frames (default 20 x --frames)",
    )
    return parser


def _run(fn: Callable[[], Awaitable[T]]) -> T:
    return trio.run(fn)


def _server_suite(
    server: servers.ServerProcess, model: str | None, messages: list[str], big_append: str
) -> dict[str, Any]:
    """Rows 3-5 against one running server, after one warm-up session."""
    url = server.url
    pings = max(10, min(50, 4 * len(messages)))

    async def suite() -> dict[str, Any]:
        await streams.warm_up(url, model, messages[:WARMUP_FRAMES])
        return {
            "paced": await streams.paced(url, model, messages, server.cpu_seconds),
            "unpaced": await streams.unpaced(url, model, messages, server.cpu_seconds),
            "responsiveness": await streams.responsiveness(url, model, big_append),
            "ping_floor": await streams.ping_floor(url, model, pings),
        }

    return _run(suite)


def _breakdown(path: Path, frames: int, peer: bool) -> dict[str, Any]:
    """Per-hop timing on an instrumented server (see :mod:`benchmarks.breakdown`)."""
    hops = breakdown.breakdown(path, frames + breakdown.SKIP, paced=True, peer=peer)
    return {"frames": frames, "hops_us": hops, "overhead_us": hops[breakdown.OVERHEAD]}


def _derive(suite: dict[str, Any], bare: dict[str, Any] | None) -> None:
    """Add the figures relative to the bare model (overhead, ratio, targets)."""
    if bare is None:
        return
    step = bare["step_ms"]
    paced = suite.get("paced")
    if paced is not None:
        # Against the bare model stepped at the same 80 ms pace (same idle regime).
        reference = bare["paced_step_ms"]
        latency = paced["latency_ms"]
        paced["bare_step_ms"] = {q: reference[q] for q in ("p50", "p95", "p99")}
        paced["overhead_ms"] = {q: latency[q] - reference[q] for q in ("p50", "p95", "p99")}
        paced["overhead_vs_back_to_back_ms_p50"] = latency["p50"] - step["p50"]
        paced["target_met"] = paced["overhead_ms"]["p50"] <= OVERHEAD_TARGET_MS
    unpaced = suite.get("unpaced")
    if unpaced is not None:
        unpaced["bare_fps"] = bare["fps"]
        unpaced["ratio_to_bare"] = unpaced["fps"] / bare["fps"]
        unpaced["target_met"] = unpaced["ratio_to_bare"] >= UNPACED_TARGET_RATIO
    resp = suite.get("responsiveness")
    if resp is not None:
        resp["bare_step_ms_p50"] = step["p50"]
        resp["bare_step_ms_p95"] = step["p95"]
        # "Within one frame's compute time": the pong within one bare step, and at
        # most the one frame already running when the cancel arrived.
        resp["pong_target_met"] = resp["pong_ms"] <= step["p50"]
        resp["cancel_target_met"] = resp["frames_after_cancel"] <= 1
        resp["target_met"] = resp["pong_target_met"] and resp["cancel_target_met"]


COMPARISONS: Final = (
    # (row, path into the suite, lower is better, counts toward the target)
    ("paced", ("latency_ms", "p50"), True, True),
    ("paced", ("latency_ms", "p95"), True, True),
    ("paced", ("latency_ms", "p99"), True, True),
    ("unpaced", ("fps",), False, True),
    ("responsiveness", ("pong_ms",), True, True),
    ("responsiveness", ("cancel_ms",), True, True),
    ("responsiveness", ("frames_after_cancel",), True, True),
    ("paced", ("breakdown", "overhead_us", "p50"), True, False),
    ("ping_floor", ("back_to_back_us", "p50"), True, False),
    ("ping_floor", ("paced_us", "p50"), True, False),
    ("paced", ("server_cpu_ms_per_frame",), True, False),
    ("unpaced", ("server_cpu_ms_per_frame",), True, False),
)


def _dig(obj: dict[str, Any], path: Sequence[str]) -> float:
    value: Any = obj
    for key in path:
        value = value[key]
    return float(value)


def _dig_or_none(obj: dict[str, Any], path: Sequence[str]) -> Any:
    value: Any = obj
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def _headline(suite: dict[str, Any]) -> dict[str, Any]:
    """One round's compared figures, kept so a run's spread can be read, not only its medians."""
    return {
        ".".join((row, *path)): _dig_or_none(suite.get(row, {}), path)
        for row, path, _, _ in COMPARISONS
    }


def compare(ours: dict[str, Any], peer: dict[str, Any]) -> dict[str, Any]:
    """ours/peer for every row 3-5 figure, and whether ours is at least as good."""
    out: dict[str, Any] = {}
    for row, path, lower_better, counts in COMPARISONS:
        if row not in ours or row not in peer:
            continue
        if any(_dig_or_none(side[row], path) is None for side in (ours, peer)):
            continue
        a, b = _dig(ours[row], path), _dig(peer[row], path)
        name = f"{row}.{'.'.join(path)}"
        ratio = a / b if b else (math.inf if a else 1.0)
        out[name] = {
            "ours": a,
            "peer": b,
            "ratio": ratio,
            "at_least_as_good": a <= b if lower_better else a >= b,
            "target": counts,
        }
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = set(args.rows or (MODEL_ROWS if args.model else ALL_ROWS))
    if args.no_peer:
        rows.discard(7)
    if 7 in rows:
        rows |= {3, 4, 5}  # the peer is compared with this server's rows 3-5
    if rows & {3, 4, 5, 7}:
        rows.add(1)  # overheads and ratios are against the bare step of this run
    if args.model is not None:
        from realtime.models import check_model_path

        check_model_path(str(args.model))
        path = args.model.resolve()
    elif rows - {2}:
        from realtime.demo.checkpoint import SIZES, ensure_demo_checkpoint

        path = ensure_demo_checkpoint(size=SIZES[args.size])
    else:
        path = None
    frames: int = args.frames
    # The checkpoint's figures: every server row's audio is cut and encoded by them.
    figures = figures_for(path)
    size, rate = figures.frame_samples, figures.input_sample_rate
    append_frames = max(1, round(args.append_seconds * figures.frames_per_second))
    total = max(frames, append_frames, WARMUP_FRAMES, rate // size + 1)
    pcm = test_pcm(total * size)
    messages = frame_messages(pcm[: frames * size], figures)
    big_append = append_message(pcm[: append_frames * size], rate)
    one_second = append_message(pcm[:rate], rate)
    append_seconds = append_frames * figures.frame_seconds

    results: dict[str, Any] = {
        "command": "python -m benchmarks " + shlex.join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": str(path) if path is not None else None,
        "frames": frames,
        "rows_run": sorted(rows),
        "load_average_start": _loadavg(),
    }
    skipped = {"skipped": "not selected"}
    bare: dict[str, Any] | None = None

    if 1 in rows:
        assert path is not None
        _log("row 1: bare model")
        bare = bare_model(path, pcm_to_float(pcm), frames, figures)
    results["bare"] = bare if bare is not None else skipped

    if 2 in rows:
        _log("row 2: zero-cost model through the server")
        n = args.zero_cost_frames or 20 * frames
        null = figures_for(None)  # the zero-cost model's, whatever --model is
        zero_messages = frame_messages(test_pcm(n * null.frame_samples, seed=1), null)
        with servers.null_server() as server:

            async def zero() -> dict[str, Any]:
                await streams.warm_up(server.url, None, zero_messages[:50])
                trips = await streams.round_trips(server.url, None, zero_messages[: 10 * frames])
                stream = await streams.unpaced(server.url, None, zero_messages, server.cpu_seconds)
                return {**stream, **trips, "round_trip_frames": trips["frames"], "frames": n}

            results["zero_cost"] = _run(zero)
    else:
        results["zero_cost"] = skipped

    ours: dict[str, Any] = {}
    if rows & {3, 4, 5}:
        assert path is not None
        _log("rows 3-5: this server on the checkpoint")
        with servers.ours(path) as server:
            ours = _server_suite(server, None, messages, big_append)
        ours["responsiveness"]["append_seconds"] = append_seconds
        _derive(ours, bare)
        if 3 in rows and not args.no_breakdown:
            _log("row 3: per-hop breakdown on an instrumented copy of this server")
            ours["paced"]["breakdown"] = _breakdown(path, frames, peer=False)
    for number in (3, 4, 5):
        name = ROW_NAMES[number]
        results[name] = ours[name] if number in rows else skipped
    results["ping_floor"] = ours.get("ping_floor", skipped)

    if 6 in rows:
        assert path is not None
        _log(f"row 6: {args.sessions} sessions, every {args.abrupt_every}th dropped")
        with servers.ours(path) as server:
            results["churn"] = _run(
                lambda: streams.churn(server, args.sessions, args.abrupt_every, one_second)
            )
        churn = results["churn"]
        churn["target_met"] = churn["slot_free_after"] and churn["busy_refusals"] == 0
    else:
        results["churn"] = skipped

    if 7 in rows:
        assert path is not None
        # Every round runs both servers and (unless --no-breakdown) both instrumented
        # copies, in the same order: the in-server overheads are compared as medians
        # of alternating rounds like every other figure (round 1 of this server is
        # row 3's run, which row 7 implies).
        ours_rounds = [ours]
        peer_rounds: list[dict[str, Any]] = []
        for round_ in range(args.rounds):
            if round_:
                _log(f"row 7: round {round_ + 1}/{args.rounds}, this server")
                with servers.ours(path) as server:
                    ours_rounds.append(_server_suite(server, None, messages, big_append))
                if not args.no_breakdown:
                    _log(f"row 7: round {round_ + 1}/{args.rounds}, instrumented copy of it")
                    ours_rounds[-1]["paced"]["breakdown"] = _breakdown(path, frames, peer=False)
            _log(f"row 7: round {round_ + 1}/{args.rounds}, mlx-vlm's server")
            with servers.peer(path) as server:
                peer_rounds.append(_server_suite(server, str(path), messages, big_append))
            if not args.no_breakdown:
                _log(f"row 7: round {round_ + 1}/{args.rounds}, instrumented copy of mlx-vlm's")
                peer_rounds[-1]["paced"]["breakdown"] = _breakdown(path, frames, peer=True)
        ours_median, peer = median_of(ours_rounds), median_of(peer_rounds)
        for suite in (ours_median, peer):
            suite["responsiveness"]["append_seconds"] = append_seconds
            _derive(suite, bare)
        peer["rounds"] = args.rounds
        peer["per_round"] = {
            "ours": [_headline(suite) for suite in ours_rounds],
            "peer": [_headline(suite) for suite in peer_rounds],
        }
        peer["ours_median"] = ours_median
        peer["comparison"] = compare(ours_median, peer)
        peer["target_met"] = bool(peer["comparison"]) and all(
            c["at_least_as_good"] for c in peer["comparison"].values() if c["target"]
        )
        results["peer"] = peer
    else:
        results["peer"] = {"skipped": "--no-peer" if args.no_peer else "not selected"}
    if 8 in rows:
        assert path is not None
        _log(f"row 8: {', '.join(map(str, args.concurrent))} concurrent paced conversations")
        results["sessions"] = sessions.sweep(
            path, args.concurrent, frames * figures.frame_seconds, log=_log
        )
    else:
        results["sessions"] = skipped
    if 9 in rows:
        assert path is not None
        _log("row 9: the frame step's exact counts")
        results["graph"] = graph.counts_of(path, frames=2)
    else:
        results["graph"] = skipped
    results["load_average_end"] = _loadavg()
    return results


def _log(message: str) -> None:
    load = _loadavg()
    suffix = f" (load average {load:.2f})" if load is not None else ""
    print(f"benchmarks: {message}{suffix}", file=sys.stderr, flush=True)


def _loadavg() -> float | None:
    """The 1-minute load average: a run on a busy machine shows it here."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# --- the table ----------------------------------------------------------------------


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _scaled(ms: float | None) -> float | None:
    return None if ms is None else ms * 1e3


def _pcts(summary: dict[str, Any], digits: int = 2) -> str:
    return " / ".join(_f(summary[q], digits) for q in ("p50", "p95", "p99"))


def _met(value: Any) -> str:
    return "" if value is None else ("MET" if value else "MISSED")


def table(results: dict[str, Any]) -> str:
    """The human-readable summary; the JSON holds every figure."""
    lines: list[tuple[str, str, str, str]] = []

    def add(row: str, metric: str, value: str, target: str = "") -> None:
        lines.append((row, metric, value, target))

    bare = results["bare"]
    if "skipped" not in bare:
        add("1 bare", "step ms p50/p95/p99", _pcts(bare["step_ms"]))
        add("1 bare", "frames/s", _f(bare["fps"], 1))
        add("1 bare", "paced step ms p50/p95/p99", _pcts(bare["paced_step_ms"]))
        adapter = bare.get("adapter", {})
        if "step_ms" in adapter:
            add("1 bare", "adapter step ms p50/p95/p99", _pcts(adapter["step_ms"]))
    zero = results["zero_cost"]
    if "skipped" not in zero:
        add("2 zero-cost", "frames/s (one connection)", _f(zero["fps"], 0))
        add("2 zero-cost", "us/frame pipelined", _f(zero["us_per_frame"], 0))
        add("2 zero-cost", "round trip us p50/p95/p99", _pcts(zero["round_trip_us"], 0))
        add("2 zero-cost", "server CPU us/frame", _f(_scaled(zero["server_cpu_ms_per_frame"]), 0))
    paced = results["paced"]
    if "skipped" not in paced:
        add("3 paced", "latency ms p50/p95/p99", _pcts(paced["latency_ms"]))
        add("3 paced", "server CPU ms/frame", _f(paced["server_cpu_ms_per_frame"]))
        if "breakdown" in paced:
            add(
                "3 paced",
                "in-server overhead us p50/p95",
                " / ".join(_f(paced["breakdown"]["overhead_us"][q], 0) for q in ("p50", "p95")),
                "(instrumented: total minus model step)",
            )
        if "overhead_ms" in paced:
            add("3 paced", "bare paced step ms p50/p95/p99", _pcts(paced["bare_step_ms"]))
            add(
                "3 paced",
                "overhead ms p50/p95/p99",
                _pcts(paced["overhead_ms"]),
                f"p50 <= {OVERHEAD_TARGET_MS:g} ms: {_met(paced['target_met'])}",
            )
    unpaced = results["unpaced"]
    if "skipped" not in unpaced:
        add("4 unpaced", "frames/s", _f(unpaced["fps"], 1))
        if "ratio_to_bare" in unpaced:
            add(
                "4 unpaced",
                "ratio to bare",
                _f(unpaced["ratio_to_bare"], 3),
                f">= {UNPACED_TARGET_RATIO}: {_met(unpaced['target_met'])}",
            )
    resp = results["responsiveness"]
    if "skipped" not in resp:
        step = resp.get("bare_step_ms_p50")
        add(
            "5 responsive",
            "pong ms",
            _f(resp["pong_ms"]),
            f"<= 1 step ({_f(step)} ms): {_met(resp.get('pong_target_met'))}",
        )
        add("5 responsive", "cancelled ms", _f(resp["cancel_ms"]), "(rest of the running frame)")
        add("5 responsive", "deltas received after cancel", _f(resp["deltas_after_cancel"]))
        add(
            "5 responsive",
            "frames run after cancel",
            f"{resp['frames_after_cancel']} (last delta {resp['last_delta_frame_before_cancel']}"
            f", cancelled at {resp['cancelled_frame_index']})",
            f"<= 1: {_met(resp.get('cancel_target_met'))}",
        )
    floor = results.get("ping_floor", {})
    if floor and "skipped" not in floor:
        add(
            "5 responsive",
            "ping RTT idle us p50 (b2b / 80 ms)",
            " / ".join(_f(floor[k]["p50"], 0) for k in ("back_to_back_us", "paced_us")),
        )
    churn = results["churn"]
    if "skipped" not in churn:
        add("6 churn", "sessions (abrupt)", f"{churn['sessions']} ({churn['abrupt']})")
        add("6 churn", "sessions/s", _f(churn["sessions_per_s"]))
        add(
            "6 churn",
            "RSS MB start / warm / end",
            " / ".join(_f(churn[k], 1) for k in ("rss_start_mb", "rss_warm_mb", "rss_end_mb")),
        )
        add("6 churn", "busy refusals", _f(churn["busy_refusals"]))
        add("6 churn", "release after drop ms p50/p99", _pcts(churn["release_after_drop_ms"]))
        add(
            "6 churn",
            "slot free after (health, next)",
            _f(churn["slot_free_after"]),
            _met(churn["target_met"]),
        )
    peer = results["peer"]
    if "skipped" not in peer:
        add("7 vs mlx-vlm", "rounds (medians compared)", str(peer.get("rounds")))
        for name, c in peer.get("comparison", {}).items():
            add(
                "7 vs mlx-vlm",
                name,
                f"{_f(c['ours'])} vs {_f(c['peer'])} (x{_f(c['ratio'], 3)})",
                ("ours at least as good" if c["at_least_as_good"] else "WORSE")
                + ("" if c["target"] else " (info)"),
            )
    concurrent = results.get("sessions", {"skipped": "not selected"})
    if "skipped" not in concurrent:
        for line in sessions.rows_of(concurrent):
            cell = dict(zip(sessions.HEADERS, line, strict=True))
            n = cell["N"]
            add(
                "8 sessions",
                f"N={n}: latency ms p50/p95/p99, worst p95",
                f"{cell['latency ms p50 / p95 / p99']}, {cell['worst conv p95']}",
                f"real time: {cell['real time']}",
            )
            add(
                "8 sessions",
                f"N={n}: frames > 2 frames, lag growth ms",
                f"{cell['frames > 2 frames']}, {cell['lag growth ms']}",
            )
            add(
                "8 sessions",
                f"N={n}: engine busy, server CPU ms/frame",
                f"{cell['engine busy']}, {cell['CPU ms/frame']}",
            )
            if cell["problems"] != "-":
                add("8 sessions", f"N={n}: problems", cell["problems"])
        add(
            "8 sessions",
            "largest N all real time",
            str(concurrent["max_realtime_sessions"]),
            f"({concurrent['seconds']:g} s each)",
        )
    counted = results.get("graph", {"skipped": "not selected"})
    if "skipped" not in counted:
        for shape in counted["shapes"]:
            add(
                "9 graph",
                f"{shape['shape']}: waits, compute, views, AsType",
                ", ".join(f"{shape[k]:,.1f}" for k in ("waits", "compute", "views", "astype")),
                f"host {shape['host_ms']:.1f} ms (a timing)",
            )
    headers = ("row", "metric", "value", "target")
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(headers)]
    out = [" | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))]
    out.append("-+-".join("-" * w for w in widths))
    out += [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    m = results.get("machine", {})
    head = [
        f"{results.get('command', '')}  ({results.get('date', '')})",
        f"{m.get('nproc')} CPUs, {m.get('cpu')}, {m.get('memory_gib')} GiB; "
        f"mlx {m.get('mlx')}, mlx-vlm {m.get('mlx_vlm')}; load average "
        f"{_f(results.get('load_average_start'))} -> {_f(results.get('load_average_end'))}",
        f"model: {results.get('model')}",
        "",
    ]
    return "\n".join(head + [line.rstrip() for line in out])


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    results = run(args)
    print(table(results))
    write_json(args.json, results)
    if args.json is not None:
        _log(f"wrote {args.json}")
    churn = results["churn"]
    if "skipped" not in churn and not churn["target_met"]:
        # Not a speed figure: a leaked session slot is a bug, so the run fails.
        _log("FAILED: the session slot was not free after churn")
        return 1
    return 0
