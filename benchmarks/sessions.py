"""``python -m benchmarks.sessions``: how many paced conversations one server keeps real time.

One ``realtime serve`` per scheduler (``--scheduler``: ``time-sliced`` runs it with
``--no-batch-frames``, each frame its own model step; ``batched`` with
``--batch-frames``, the frames that are due as one step), each with ``--max-sessions``
the largest N swept and admission by load off (``--admission-margin 0``), so the
benchmark, not the server's own estimate, finds the limit. For each scheduler and N
(``--sessions``), N concurrent conversations on the native endpoint, each with its own
audio and seed, send one 80 ms append per frame time for ``--seconds``, their starts
staggered within one frame. Per scheduler and N:

* frame latency over all conversations, measured as row 3 measures it (the append
  leaving the client to that frame's ``response.audio.delta`` arriving);
* frames later than two frame times (160 ms: the frame missed its slot);
* backlog growth: each conversation's latency fitted against time (how much later its
  last frames came back than its first), the appends it had unanswered, its lag at the
  end;
* the engine's busy fraction (``realtime_batch_step_seconds`` sum over wall time, from
  ``/metrics``), the model steps and their mean rows, the step time per batch and per
  conversation-frame (step time over its rows), also by batch size, and the server's
  CPU per frame (all threads);
* refusals, error events and connection errors counted by the server, client-side
  failures, and problem lines in the server's log.

A conversation is real time when its p95 is within two frame times, its fitted lag grew
by less than one frame time over the run, and every frame came back. The headline is the
largest N, counting up from the smallest, at which every conversation is, per
scheduler. With ``--rounds R`` the sweep runs R times on the same servers (every other
round with the schedulers and the Ns in reverse order) and each figure is the median of
the rounds, its spread kept beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import trio
from prometheus_client.parser import text_string_to_metric_families

from benchmarks import servers, streams
from benchmarks.bare import WARMUP_FRAMES
from benchmarks.common import checkpoint_parser, model_path, write_json
from benchmarks.stats import command_line, machine, median_of, summarize
from benchmarks.streams import PacedTimes
from benchmarks.wire import (
    BenchError,
    Client,
    connect,
    figures_for,
    frame_messages,
    http_get,
    test_pcm,
)

MISSED_FRAMES: Final = 2.0
"""A frame whose audio came back later than this many frame times missed its slot."""
GROWTH_FRAMES: Final = 1.0
"""A conversation whose fitted lag grew by more than this many frame times over the run
has a growing backlog: the engine is not keeping up with it."""
AUDIO_SEED: Final = 100
"""Conversation k streams ``test_pcm(seed=AUDIO_SEED + k)`` with model seed ``k + 1``."""
GIVE_UP_SECONDS: Final = 10.0
"""A run stops once a conversation has this much audio unanswered (well inside the
server's 20 s pending-audio limit): that N has already failed."""
LEAD_SECONDS: Final = 0.2
"""From the last scrape before a run to its first append."""
TAIL_FRAMES: Final = 12
"""The last second of a conversation: its lag at the end."""
IDLE_WAIT: Final = 60.0
PROBLEM_LINE: Final = re.compile(
    r"Traceback|^\S+ \S+ (?:WARNING|ERROR|CRITICAL) |outcome=(?:error|timeout|stalled_client)"
)
"""A server log line worth reading: a traceback, a warning or worse, a session that
ended badly (the text log format ``realtime serve`` writes by default)."""

Log = Callable[[str], None]

SCHEDULERS: Final = {
    "time-sliced": ("--no-batch-frames",),
    "batched": ("--batch-frames",),
    "batched-openblas": ("--batch-frames", "--cpu-blas", "openblas"),
}
"""Each scheduler and the ``realtime serve`` flags that select it. ``batched-openblas``
is the batched scheduler with MLX's CPU matmuls on a system OpenBLAS
(:mod:`realtime.cpu_blas`; Linux)."""


def session_counts(text: str) -> tuple[int, ...]:
    """``1,2,4`` -> (1, 2, 4): the conversation counts to sweep, ascending."""
    try:
        counts = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected counts like 1,2,4; got {text!r}") from None
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"counts are integers >= 1; got {text!r}")
    return counts


def scheduler_names(text: str) -> tuple[str, ...]:
    """``time-sliced,batched`` -> ("time-sliced", "batched"): the schedulers to compare,
    in the order given, each once."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [n for n in names if n not in SCHEDULERS]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"expected schedulers among {', '.join(SCHEDULERS)}; got {text!r}"
        )
    return names


def _log(message: str) -> None:
    print(f"sessions: {message} (load average {load_average()})", file=sys.stderr, flush=True)


# --- the server's own figures ------------------------------------------------------


async def scrape(http: str) -> dict[str, float]:
    """Every ``/metrics`` sample (histogram buckets left out) by name and labels, plus
    each labelled counter's total under its bare name."""
    status, body = await http_get(http, "/metrics", accept="text/plain")
    if status != 200:
        raise BenchError(f"/metrics answered {status}")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode("utf-8")):
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                continue
            value = float(sample.value)
            if sample.labels:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = value
                out[sample.name] = out.get(sample.name, 0.0) + value
            else:
                out[sample.name] = value
    return out


def _delta(before: dict[str, float], after: dict[str, float], name: str) -> float:
    return after.get(name, 0.0) - before.get(name, 0.0)


def _labelled_deltas(
    before: dict[str, float], after: dict[str, float], name: str
) -> dict[str, float]:
    """Non-zero changes of ``name``'s labelled series, keyed by their labels."""
    prefix = name + "{"
    out = {}
    for key, value in after.items():
        if key.startswith(prefix) and (change := value - before.get(key, 0.0)):
            out[key[len(prefix) : -1]] = change
    return out


async def wait_idle(http: str) -> None:
    """Until the server holds no session: the previous N's closes are done, so a refusal
    in the next run is a finding, not that race."""
    with trio.move_on_after(IDLE_WAIT):
        while (await scrape(http)).get("realtime_active_sessions", 0.0) > 0:
            await trio.sleep(0.05)


# --- one N ---------------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    """One line for an exception (the leaves of a trio exception group)."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"[:500]


async def _stream(
    client: Client, messages: list[str], start: float, times: PacedTimes, errors: list[str]
) -> None:
    try:
        await streams.paced_stream(client, messages, start, times)
    except Exception as exc:  # recorded: a failing conversation is what this measures
        errors.append(_describe(exc))


async def _close(client: Client, errors: list[str]) -> None:
    with trio.move_on_after(60) as scope:
        try:
            await streams.cancel_and_close(client)
        except Exception as exc:
            errors.append("close: " + _describe(exc))
    if scope.cancelled_caught:
        errors.append("close: no response.cancelled within 60 s")


def conversation_figures(times: PacedTimes, frames: int, frame_ms: float) -> dict[str, Any]:
    """One conversation's latency, backlog and verdict from its clock readings."""
    latencies = np.asarray(times.latencies_ms(), dtype=np.float64)
    answered = int(latencies.size)
    sent = np.asarray(times.sent, dtype=np.float64)
    received = np.asarray(times.received, dtype=np.float64)
    growth = slope = tail = outstanding_max = outstanding_end = None
    if answered >= 3 and np.ptp(sent[:answered]) > 0:
        # Latency against send time, least squares: how much later the answers came back
        # by the end of the run than at its start (ms per second, and over the run).
        span = float(sent[answered - 1] - sent[0])
        fit = np.polyfit(sent[:answered] - sent[0], latencies, 1)
        slope = float(fit[0])  # ms per second
        growth = float(fit[0]) * span
    if answered:
        tail = float(np.median(latencies[-TAIL_FRAMES:]))
    if sent.size:
        # Appends out before append i that had no answer yet when it went out.
        waiting = np.arange(sent.size) - np.searchsorted(received, sent)
        outstanding_max = int(waiting.max())
        outstanding_end = int(waiting[-1])
    summary = summarize(latencies.tolist())
    complete = answered == frames
    realtime = bool(
        complete
        and summary.p95 <= MISSED_FRAMES * frame_ms
        and growth is not None
        and growth <= GROWTH_FRAMES * frame_ms
    )
    return {
        "frames": frames,
        "answered": answered,
        "latency_ms": summary.to_dict(),
        "missed_frames": int((latencies > MISSED_FRAMES * frame_ms).sum()),
        "lag_growth_ms": growth,
        "lag_slope_ms_per_s": slope,
        "tail_latency_ms": tail,
        "outstanding_max": outstanding_max,
        "outstanding_end": outstanding_end,
        "send_lateness_ms_p99": summarize([x * 1e3 for x in times.late]).p99,
        "realtime": realtime,
    }


def _mean_ms(before: dict[str, float], after: dict[str, float], histogram: str) -> float | None:
    """A histogram's mean between two scrapes, in ms."""
    count = _delta(before, after, histogram + "_count")
    return _delta(before, after, histogram + "_sum") / count * 1e3 if count else None


def step_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """The model steps between two scrapes (``realtime_batch_step_seconds`` by rows):
    how many, their mean rows, the step time per batch and per conversation-frame, and
    the same by batch size (rows)."""
    name = "realtime_batch_step_seconds"
    counts = _labelled_deltas(before, after, name + "_count")
    sums = _labelled_deltas(before, after, name + "_sum")
    by_rows: dict[str, dict[str, float]] = {}
    frames = 0.0
    for label, steps in sorted(counts.items(), key=lambda kv: int(kv[0].partition("=")[2])):
        rows = int(label.partition("=")[2])
        seconds = sums.get(label, 0.0)
        frames += rows * steps
        by_rows[str(rows)] = {
            "steps": steps,
            "ms_per_batch": seconds / steps * 1e3,
            "ms_per_frame": seconds / steps / rows * 1e3,
        }
    steps = sum(counts.values())
    seconds = sum(sums.values())
    return {
        "model_steps": steps,
        "rows_per_step_mean": frames / steps if steps else None,
        "step_ms_per_batch": seconds / steps * 1e3 if steps else None,
        "step_ms_per_frame": seconds / frames * 1e3 if frames else None,
        "step_by_rows": by_rows,
    }


def _max(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None and np.isfinite(v)]
    return max(present) if present else None


async def _give_up_when_behind(
    times: Sequence[PacedTimes],
    limit: int,
    streaming: trio.CancelScope,
    gave_up: list[dict[str, Any]],
) -> None:
    """Cancel ``streaming`` once any conversation has more than ``limit`` appends
    unanswered: that N is not real time, and going on only queues audio toward the
    server's pending limit and makes the backlog take minutes to drain."""
    started = time.perf_counter()
    while True:
        await trio.sleep(0.25)
        for k, t in enumerate(times):
            behind = len(t.sent) - len(t.received)
            if behind > limit:
                after = time.perf_counter() - started
                gave_up.append({"conversation": k, "unanswered": behind, "after_seconds": after})
                streaming.cancel()
                return


async def run_count(
    server: servers.ServerProcess,
    n: int,
    audio: Sequence[list[str]],
    give_up_seconds: float = GIVE_UP_SECONDS,
    times: Sequence[PacedTimes] | None = None,
) -> dict[str, Any]:
    """N conversations at once: configured together, streamed from one shared start
    (conversation k a k/N frame later), then cancelled and closed together. The run
    stops early when a conversation falls ``give_up_seconds`` behind (0: never).
    ``times``: the N conversations' clock readings are kept there (fresh ones if None),
    for a caller that reads more from them."""
    errors: list[list[str]] = [[] for _ in range(n)]
    times = [PacedTimes() for _ in range(n)] if times is None else times
    if len(times) != n:
        raise ValueError(f"{n} conversations need {n} PacedTimes, got {len(times)}")
    gave_up: list[dict[str, Any]] = []
    first = await scrape(server.http)
    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(connect(server.url, None)) for _ in range(n)]
        async with trio.open_nursery() as nursery:
            for k, client in enumerate(clients):
                configure = functools.partial(
                    client.configure, seed=k + 1, within=streams.STREAM_TIMEOUT
                )
                nursery.start_soon(configure)
        frame = clients[0].conn.frame_seconds
        before = await scrape(server.http)
        cpu_before = server.cpu_seconds()
        start = trio.current_time() + LEAD_SECONDS
        window_start = time.perf_counter() + LEAD_SECONDS
        async with trio.open_nursery() as watch:
            streaming = trio.CancelScope()
            if give_up_seconds > 0:
                limit = max(1, round(give_up_seconds / frame))
                watch.start_soon(_give_up_when_behind, times, limit, streaming, gave_up)
            with streaming:
                async with trio.open_nursery() as nursery:
                    for k, client in enumerate(clients):
                        begin = start + k * frame / n
                        nursery.start_soon(_stream, client, audio[k], begin, times[k], errors[k])
            watch.cancel_scope.cancel()
        window = time.perf_counter() - window_start
        cpu_after = server.cpu_seconds()
        after = await scrape(server.http)
        async with trio.open_nursery() as nursery:
            for k, client in enumerate(clients):
                if not errors[k]:
                    nursery.start_soon(_close, client, errors[k])
        busy_retries = sum(client.busy_retries for client in clients)
    await wait_idle(server.http)  # every session ended: its outcome is counted
    last = await scrape(server.http)
    frame_ms = frame * 1e3
    frames = len(audio[0])
    conversations = [conversation_figures(t, frames, frame_ms) for t in times]
    for figures, problems in zip(conversations, errors, strict=True):
        figures["errors"] = problems
        figures["realtime"] = figures["realtime"] and not problems
    latencies = [x for t in times for x in t.latencies_ms()]
    answered = len(latencies)
    step_sum = _delta(before, after, "realtime_batch_step_seconds_sum")  # each step once
    steps = _delta(before, after, "realtime_model_step_seconds_count")
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    return {
        "sessions": n,
        "frames_per_conversation": frames,
        "frames": answered,
        # From the first append due to the end of the last stream (or the stop).
        "wall_seconds": window,
        "latency_ms": summarize(latencies).to_dict(),
        "worst_p95_ms": _max([c["latency_ms"]["p95"] for c in conversations]),
        "missed_frames": sum(c["missed_frames"] for c in conversations),
        "missed_fraction": (
            sum(c["missed_frames"] for c in conversations) / answered if answered else None
        ),
        "lag_growth_ms_max": _max([c["lag_growth_ms"] for c in conversations]),
        "tail_latency_ms_max": _max([c["tail_latency_ms"] for c in conversations]),
        "outstanding_max": _max([c["outstanding_max"] for c in conversations]),
        "send_lateness_ms_p99_max": _max([c["send_lateness_ms_p99"] for c in conversations]),
        "engine_busy": step_sum / window if window > 0 else None,
        "engine_steps": steps,
        "engine_step_ms_mean": _mean_ms(before, after, "realtime_model_step_seconds"),
        **step_figures(before, after),
        "server_frame_latency_ms_mean": _mean_ms(before, after, "realtime_frame_latency_seconds"),
        "server_cpu_ms_per_frame": cpu * 1e3 / answered if cpu is not None and answered else None,
        "server_cpu_cores": cpu / window if cpu is not None and window > 0 else None,
        "busy_retries": busy_retries,
        # From before the first connection to after the last session ended:
        "refused": _labelled_deltas(first, last, "realtime_connections_refused_total"),
        "error_events": _labelled_deltas(first, last, "realtime_error_events_total"),
        "connection_errors": _delta(first, last, "realtime_connection_errors_total"),
        "session_outcomes": _labelled_deltas(first, last, "realtime_sessions_total"),
        "session_open_ms_mean": _mean_ms(first, last, "realtime_session_open_seconds"),
        "client_errors": [e for problems in errors for e in problems],
        "gave_up": gave_up[0] if gave_up else None,
        "conversations": conversations,
        "realtime": all(c["realtime"] for c in conversations),
    }


# --- the sweep -------------------------------------------------------------------------

SPREAD: Final = (
    ("latency_ms", "p50"),
    ("latency_ms", "p95"),
    ("latency_ms", "p99"),
    ("worst_p95_ms",),
    ("missed_frames",),
    ("lag_growth_ms_max",),
    ("engine_busy",),
    ("step_ms_per_batch",),
    ("step_ms_per_frame",),
    ("server_cpu_ms_per_frame",),
)
"""Figures whose value in every round is kept beside the median."""


def _dig(obj: dict[str, Any], path: Sequence[str]) -> Any:
    value: Any = obj
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One N's rounds: every number the median of the rounds (via ``stats.median_of``),
    the headline figures of each round, and real time when most rounds were."""

    numeric = [{k: v for k, v in r.items() if k != "conversations"} for r in rounds]
    out = median_of(numeric)
    out["rounds"] = len(rounds)
    out["per_round"] = {".".join(path): [_dig(r, path) for r in rounds] for path in SPREAD}
    out["realtime_rounds"] = sum(1 for r in rounds if r["realtime"])
    out["realtime"] = 2 * out["realtime_rounds"] > len(rounds)
    out["refused"] = _merge([r["refused"] for r in rounds])
    out["error_events"] = _merge([r["error_events"] for r in rounds])
    out["session_outcomes"] = _merge([r["session_outcomes"] for r in rounds])
    out["client_errors"] = [e for r in rounds for e in r["client_errors"]]
    out["busy_retries"] = sum(r["busy_retries"] for r in rounds)
    out["gave_up"] = [r["gave_up"] for r in rounds if r["gave_up"]]
    return out


def _merge(counts: list[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for one in counts:
        for key, value in one.items():
            out[key] = out.get(key, 0.0) + value
    return out


def criterion(frame_ms: float) -> str:
    """What real time means here, in words, for a model of ``frame_ms`` frames."""
    return (
        f"every conversation: p95 <= {MISSED_FRAMES * frame_ms:g} ms, fitted lag growth "
        f"<= {GROWTH_FRAMES * frame_ms:g} ms over the run, every frame answered"
    )


def headline(by_sessions: list[dict[str, Any]]) -> int:
    """The largest N, counting up, at which every conversation stayed real time (0: not
    even the smallest)."""
    best = 0
    for row in by_sessions:
        if not row["realtime"]:
            break
        best = row["sessions"]
    return best


def server_problems(log: str, limit: int = 20) -> list[str]:
    """Log lines that look like trouble (tracebacks, errors, warnings), first few."""
    return [line for line in log.splitlines() if PROBLEM_LINE.search(line)][:limit]


def sweep(
    path: Path,
    counts: Sequence[int],
    seconds: float,
    rounds: int = 1,
    log: Log = _log,
    give_up_seconds: float = GIVE_UP_SECONDS,
    schedulers: Sequence[str] = ("batched",),
) -> dict[str, Any]:
    """Every N of ``counts`` under every scheduler, on one server per scheduler started
    for the sweep (all up at once, so the rounds alternate between them), ``rounds``
    times."""
    counts = sorted(set(counts))
    schedulers = list(dict.fromkeys(schedulers))
    figures = figures_for(path)
    size = figures.frame_samples
    frames = max(1, round(seconds * figures.frames_per_second))
    top = counts[-1]
    log(f"encoding {top} x {frames} frames of distinct audio")
    audio = [
        frame_messages(test_pcm(frames * size, seed=AUDIO_SEED + k), figures) for k in range(top)
    ]
    warm = frame_messages(test_pcm(WARMUP_FRAMES * size, seed=AUDIO_SEED - 1), figures)
    base = ("--max-sessions", str(top), "--admission-margin", "0")
    options = {name: (*base, *SCHEDULERS[name]) for name in schedulers}
    per_round: dict[str, list[dict[int, dict[str, Any]]]] = {name: [] for name in schedulers}
    problems: dict[str, list[str]] = {}
    with contextlib.ExitStack() as stack:
        running = {
            name: stack.enter_context(servers.ours(path, *options[name])) for name in schedulers
        }

        async def run_all() -> None:
            for server in running.values():
                await streams.warm_up(server.url, None, warm)
            for r in range(rounds):
                # Every other round in reverse: no scheduler or N always runs on the
                # warmer machine.
                order = counts if r % 2 == 0 else counts[::-1]
                names = schedulers if r % 2 == 0 else schedulers[::-1]
                for name in names:
                    server = running[name]
                    results: dict[int, dict[str, Any]] = {}
                    for n in order:
                        await wait_idle(server.http)
                        log(f"round {r + 1}/{rounds}, {name}: {n} conversations x {seconds:g} s")
                        results[n] = await run_count(server, n, audio, give_up_seconds)
                        row = results[n]
                        log(
                            f"  N={n}: p50/p95 {row['latency_ms']['p50']:.1f}/"
                            f"{row['latency_ms']['p95']:.1f} ms, engine busy "
                            f"{_pct(row['engine_busy'])}, {_f(row['rows_per_step_mean'], 2)} "
                            f"rows a step of {_f(row['step_ms_per_batch'])} ms, "
                            f"real time: {row['realtime']}"
                        )
                    per_round[name].append(results)

        trio.run(run_all)
        problems = {name: server_problems(server.output()) for name, server in running.items()}
    frame_ms = figures.frame_seconds * 1e3
    by_scheduler: dict[str, dict[str, Any]] = {}
    for name in schedulers:
        by_sessions = [combine([r[n] for r in per_round[name]]) for n in counts]
        by_scheduler[name] = {
            "server_options": list(options[name]),
            "by_sessions": by_sessions,
            "per_round": [[r[n] for n in counts] for r in per_round[name]],
            "max_realtime_sessions": headline(by_sessions),
            "realtime_sessions": [row["sessions"] for row in by_sessions if row["realtime"]],
            "server_log_problems": problems[name],
        }
    return {
        "counts": counts,
        "schedulers": schedulers,
        "seconds": frames * figures.frame_seconds,
        "frames_per_conversation": frames,
        "rounds": rounds,
        "give_up_seconds": give_up_seconds,
        "frame_ms": frame_ms,
        "criterion": criterion(frame_ms),
        "by_scheduler": by_scheduler,
        "max_realtime_sessions": {
            name: one["max_realtime_sessions"] for name, one in by_scheduler.items()
        },
    }


def load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "-"


# --- the table ---------------------------------------------------------------------------


def _f(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f} %"


def _spread(row: dict[str, Any], key: str, digits: int = 1, scale: float = 1.0) -> str:
    values = [v * scale for v in row["per_round"].get(key, []) if v is not None]
    if len(values) < 2:
        return ""
    return f" [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def rows_of(result: dict[str, Any]) -> list[tuple[str, ...]]:
    """One line per scheduler and N: the figures the table prints (medians, [min-max] of
    the rounds)."""
    lines: list[tuple[str, ...]] = []
    for name in result["schedulers"]:
        lines += [(name, *line) for line in _rows(result["by_scheduler"][name]["by_sessions"])]
    return lines


def _rows(by_sessions: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    lines: list[tuple[str, ...]] = []
    for row in by_sessions:
        latency = row["latency_ms"]
        problems = []
        if row["gave_up"]:
            after = statistics.median(g["after_seconds"] for g in row["gave_up"])
            problems.append(f"stopped {len(row['gave_up'])}x, after {after:.0f} s")
        if row["client_errors"]:
            problems.append(f"{len(row['client_errors'])} client errors")
        if row["refused"]:
            problems.append("refused " + json.dumps(row["refused"]))
        if row["error_events"]:
            problems.append("errors " + json.dumps(row["error_events"]))
        odd = {k: v for k, v in row["session_outcomes"].items() if k != "outcome=cancelled"}
        if odd:
            problems.append("sessions ended " + json.dumps(odd))
        if row["connection_errors"]:
            problems.append(f"{row['connection_errors']:g} connection errors")
        if row["busy_retries"]:
            problems.append(f"{row['busy_retries']} busy retries")
        verdict = "yes" if row["realtime"] else "NO"
        if row["rounds"] > 1:
            verdict += f" ({row['realtime_rounds']}/{row['rounds']})"
        lines.append(
            (
                str(row["sessions"]),
                " / ".join(_f(latency[q]) for q in ("p50", "p95", "p99"))
                + _spread(row, "latency_ms.p95"),
                _f(row["worst_p95_ms"]) + _spread(row, "worst_p95_ms"),
                f"{row['missed_frames']:g} / {row['frames']:g}",
                _f(row["lag_growth_ms_max"]) + _spread(row, "lag_growth_ms_max"),
                _f(row["outstanding_max"], 0),
                _pct(row["engine_busy"]) + _spread(row, "engine_busy", 0, 100),
                _f(row["rows_per_step_mean"], 2),
                _f(row["step_ms_per_batch"]) + _spread(row, "step_ms_per_batch"),
                _f(row["step_ms_per_frame"]) + _spread(row, "step_ms_per_frame"),
                _f(row["server_cpu_ms_per_frame"], 2) + _spread(row, "server_cpu_ms_per_frame", 2),
                "; ".join(problems) or "-",
                verdict,
            )
        )
    return lines


HEADERS: Final = (
    "scheduler",
    "N",
    "latency ms p50 / p95 / p99",
    "worst conv p95",
    "frames > 2 frames",
    "lag growth ms",
    "max unanswered",
    "engine busy",
    "rows/step",
    "step ms/batch",
    "ms/conv-frame",
    "CPU ms/frame",
    "problems",
    "real time",
)


def table(result: dict[str, Any]) -> str:
    """The sweep as a table and its headline."""
    lines = rows_of(result)
    widths = [max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(HEADERS)]
    out = [" | ".join(h.ljust(w) for h, w in zip(HEADERS, widths, strict=True))]
    out.append("-+-".join("-" * w for w in widths))
    out += [" | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    best = ", ".join(f"{name} {n}" for name, n in result["max_realtime_sessions"].items())
    out.append("")
    out.append(
        f"largest N with every conversation real time: {best} "
        f"({result['criterion']}; {result['seconds']:g} s per N, "
        f"{result['rounds']} round{'s' if result['rounds'] != 1 else ''}, medians"
        + (" [min-max]" if result["rounds"] > 1 else "")
        + ")"
    )
    for name in result["schedulers"]:
        problems = result["by_scheduler"][name]["server_log_problems"]
        if problems:
            out.append(f"{name} server log: {len(problems)} problem lines, first:")
            out += ["  " + line[:200] for line in problems[:5]]
    return "\n".join(line.rstrip() for line in out)


# --- the command ---------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = checkpoint_parser(
        "benchmarks.sessions",
        __doc__,
        size_help="without --model: the demo checkpoint preset (default %(default)s)",
    )
    parser.add_argument(
        "--sessions",
        type=session_counts,
        default=(1, 2, 3, 4),
        help="conversation counts to sweep, e.g. 1,2,3,4,6 (default 1,2,3,4)",
    )
    parser.add_argument(
        "--scheduler",
        type=scheduler_names,
        default=("time-sliced", "batched"),
        help="schedulers to compare, each on its own server: time-sliced (--no-batch-frames), "
        "batched (--batch-frames), batched-openblas (--batch-frames --cpu-blas openblas) "
        "(default time-sliced,batched)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=60.0,
        help="audio each conversation streams per N (default %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="sweep this many times; figures are medians of the rounds (default %(default)s)",
    )
    parser.add_argument(
        "--give-up-seconds",
        type=float,
        default=GIVE_UP_SECONDS,
        help="stop an N's run once a conversation has this much audio unanswered "
        "(0: never; default %(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:

    args = build_parser().parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1:
        raise SystemExit("--seconds must be > 0 and --rounds >= 1")
    path = model_path(args)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "command": command_line("benchmarks.sessions", argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "model": str(path),
        "load_average_start": load_average(),
    }
    results.update(
        sweep(
            path,
            args.sessions,
            args.seconds,
            args.rounds,
            give_up_seconds=args.give_up_seconds,
            schedulers=args.scheduler,
        )
    )
    results["load_average_end"] = load_average()
    results["elapsed_seconds"] = time.perf_counter() - started
    m = results["machine"]
    print(f"{results['command']}  ({results['date']})")
    print(
        f"{m.get('nproc')} CPUs, {m.get('cpu')}; mlx {m.get('mlx')}; load average "
        f"{results['load_average_start']} -> {results['load_average_end']}"
    )
    print(f"model: {path}\n")
    print(table(results))
    write_json(args.json, results)
    if args.json is not None:
        _log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
