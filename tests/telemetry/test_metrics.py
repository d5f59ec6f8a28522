"""``/metrics``: the exposition parses, the hooks fill it, the API key guards it; logs."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import numpy as np
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import ConnectionRejected, open_websocket_url

from realtime.engine.admission import MIN_SAMPLES
from realtime.engine.commands import Open, Push
from realtime.engine.facade import Engine
from realtime.http.app import ServerState
from realtime.launch.server import hypercorn_config, run_server
from realtime.limits import Limits
from realtime.observe import Observers, SessionReport
from realtime.telemetry.logs import JsonFormatter, SessionLog, TextFormatter, setup_logging
from realtime.telemetry.metrics import PrometheusObserver
from realtime.testing.fake import FakeModel
from tests.engine.test_batch import batching_engine
from tests.helpers import ahttp, append_msg, connect, noise


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a text exposition, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def report(outcome: str = "done", **kw: Any) -> SessionReport:
    fields: dict[str, Any] = {
        "session_id": "sess_0123456789abcdef",
        "outcome": outcome,
        "duration": 2.5,
        "frames": 20,
        "step_seconds": tuple(0.01 * (i + 1) for i in range(20)),
        "close_code": 1000,
        "close_reason": "done",
    }
    fields.update(kw)
    return SessionReport(**fields)


def test_hooks_fill_the_exposition_on_a_private_registry() -> None:
    first, second = PrometheusObserver(), PrometheusObserver()  # no duplicate-metric error
    m = first
    m.session_started("sess_1")
    m.session_opened(0.2)
    for _ in range(3):
        m.command_finished("push", 0.03)
        m.frame_sent(0.05)
    m.command_finished("flush", 1.0)  # not a model step
    m.pending_audio("sess_a", 1.5)
    m.send_queue("sess_a", 4)
    m.pending_audio("sess_0123456789abcdef", 0.5)  # two sessions: their sum
    m.send_queue("sess_0123456789abcdef", 2)
    m.frame_deadline(-0.05, 0)
    m.frame_deadline(0.03, 2)
    m.error_sent("invalid_request")
    m.limit_refused("max_message_bytes")
    m.input_audio_dropped("opening", 1.5)
    m.input_audio_dropped("opening", 0.25)
    m.connection_refused("busy")
    m.connection_refused("unauthorized")
    text = m.exposition().decode()
    assert value(text, "realtime_active_sessions") == 1
    assert value(text, "realtime_model_step_seconds_count") == 3
    assert value(text, "realtime_model_step_seconds_sum") == pytest.approx(0.09)
    assert value(text, "realtime_frame_latency_seconds_bucket", le="0.06") == 3
    assert value(text, "realtime_frames_total") == 3
    assert value(text, "realtime_session_open_seconds_count") == 1
    assert value(text, "realtime_pending_input_audio_seconds") == 2.0
    assert value(text, "realtime_send_queue_events") == 6
    assert value(text, "realtime_engine_frames_late_total") == 1
    assert value(text, "realtime_engine_frame_lateness_seconds_bucket", le="0.0") == 1
    assert value(text, "realtime_error_events_total", code="invalid_request") == 1
    assert value(text, "realtime_error_events_total", code="inference_error") == 0
    assert value(text, "realtime_limit_refusals_total", limit="max_message_bytes") == 1
    assert value(text, "realtime_input_audio_dropped_seconds_total", reason="opening") == 1.75
    assert value(text, "realtime_input_audio_dropped_seconds_total", reason="too_fast") == 0
    assert value(text, "realtime_connections_refused_total", reason="busy") == 1
    assert value(text, "realtime_connections_refused_total", reason="draining") == 0
    assert value(text, "realtime_engine_alive") == 0  # no engine watched
    m.session_ended(report("stalled_client"))
    text = m.exposition().decode()
    assert value(text, "realtime_active_sessions") == 0
    assert value(text, "realtime_pending_input_audio_seconds") == 1.5  # the other's
    assert value(text, "realtime_sessions_total", outcome="stalled_client") == 1
    assert value(text, "realtime_sessions_total", outcome="done") == 0
    assert value(text, "realtime_stalled_client_drops_total") == 1
    m.session_ended(report("done", session_id="sess_a"))
    text = m.exposition().decode()
    assert value(text, "realtime_pending_input_audio_seconds") == 0
    assert value(text, "realtime_send_queue_events") == 0
    assert "_created" not in text
    assert value(second.exposition().decode(), "realtime_frames_total") == 0
    # The standard process collectors are on the same registry (Linux /proc).
    names = {name for name, _ in samples(text)}
    assert {"process_resident_memory_bytes", "process_open_fds", "process_cpu_seconds_total"} <= (
        names
    )


@asynccontextmanager
async def metered_server(
    fake: FakeModel, *, api_key: str | None = None
) -> AsyncIterator[tuple[str, ServerState]]:
    """An in-process server whose engine and connections report to one observer."""
    metrics = PrometheusObserver()
    observer = Observers((metrics, SessionLog()))
    engine = Engine(lambda: fake, observer=observer)
    await trio.to_thread.run_sync(engine.start)
    state = ServerState(engine=engine, api_key=api_key, metrics=metrics, observer=observer)
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(
                partial(
                    run_server,
                    state,
                    hypercorn_config("127.0.0.1", 0, Limits()),
                    shutdown_trigger=stop.wait,
                )
            )
            yield binds[0], state
            stop.set()
    finally:
        await trio.to_thread.run_sync(engine.shutdown)


async def test_metrics_route_after_a_session() -> None:
    fake = FakeModel(model_id="fake-metrics")
    async with metered_server(fake) as (http, _state):
        async with connect(http.replace("http://", "ws://") + "/v1/realtime") as client:
            await client.configure()
            await client.send(append_msg(noise(1280 * 3)))
            await client.send({"type": "input_audio_buffer.commit"})
            await client.recv_until("response.done")
            await client.closed_code()
        # The session is reported once the connection has closed on the server.
        with trio.fail_after(10):
            while True:
                status, raw = await ahttp("GET", http + "/metrics")
                text = raw.decode() if isinstance(raw, bytes) else json.dumps(raw)
                if value(text, "realtime_sessions_total", outcome="done") == 1:
                    break
                await trio.sleep(0.02)
    assert status == 200
    assert value(text, "realtime_engine_alive") == 1
    assert value(text, "realtime_active_sessions") == 0
    assert value(text, "realtime_frames_total") >= 3
    assert value(text, "realtime_model_step_seconds_count") >= 3
    assert value(text, "realtime_frame_latency_seconds_count") >= 3
    assert value(text, "realtime_session_open_seconds_count") == 1
    build = [k for k in samples(text) if k[0] == "realtime_build_info"]
    assert len(build) == 1
    labels = dict(build[0][1])
    assert labels["model"] == "fake-metrics"
    assert labels["version"]
    assert labels["mlx_backend"] in {"cpu", "metal", "cuda"}


async def test_frame_latency_is_positive_and_plausible_on_a_real_server() -> None:
    """One clock from append to socket: the sum was -6,108,403.96 s over 128 frames when
    ``perf_counter()`` was subtracted from trio time."""
    frames = 8
    async with metered_server(FakeModel()) as (http, state):
        async with connect(http.replace("http://", "ws://") + "/v1/realtime") as client:
            await client.configure()
            for _ in range(frames):
                await client.send(append_msg(noise(1280)))
            await client.send({"type": "input_audio_buffer.commit"})
            await client.recv_until("response.done")
        text = state.metrics.exposition().decode()
    count = value(text, "realtime_frame_latency_seconds_count")
    total = value(text, "realtime_frame_latency_seconds_sum")
    assert count == frames
    assert 0 < total < 2.0 * count  # a fake model answers in milliseconds


async def test_metrics_need_the_api_key_and_count_refused_upgrades() -> None:
    async with metered_server(FakeModel(), api_key="sekret") as (http, _state):
        status, _ = await ahttp("GET", http + "/metrics")
        assert status == 401
        with pytest.raises(ConnectionRejected) as refused:
            async with open_websocket_url(http.replace("http://", "ws://") + "/v1/realtime"):
                pass
        assert refused.value.status_code == 401
        status, raw = await ahttp("GET", http + "/metrics", {"Authorization": "Bearer sekret"})
        assert status == 200
        text = raw.decode()
        assert value(text, "realtime_connections_refused_total", reason="unauthorized") == 1


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    stream = io.StringIO()
    yield stream
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_session_log_json_line(log_stream: io.StringIO) -> None:
    setup_logging("info", "json", stream=log_stream)
    SessionLog().session_ended(report(frame_latency=(0.05,) * 19 + (0.09,), sessions=3))
    SessionLog().connection_refused("busy")
    lines = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    ended, refused = lines
    assert ended["message"] == "session ended"
    assert ended["logger"] == "realtime.session"
    assert ended["session_id"] == "sess_0123456789abcdef"
    assert ended["frames"] == 20
    assert ended["duration_s"] == 2.5
    assert ended["close_code"] == 1000
    assert ended["close_reason"] == "done"
    assert ended["realtime_factor"] == pytest.approx(2.1 / 1.6, abs=1e-3)
    assert 100 <= ended["step_p50_ms"] <= 110
    assert 190 <= ended["step_p95_ms"] <= 200
    assert 50 <= ended["latency_p95_ms"] <= 90 and ended["sessions"] == 3
    assert refused["reason"] == "busy" and refused["message"] == "connection refused"


def test_session_log_text_line(log_stream: io.StringIO) -> None:
    setup_logging("info", "text", stream=log_stream)
    SessionLog().session_ended(report(close_reason="client went away", step_seconds=()))
    (line,) = log_stream.getvalue().splitlines()
    assert "realtime.session: session ended session_id=sess_0123456789abcdef" in line
    assert "realtime_factor=- " in line and 'close_reason="client went away"' in line


def test_formatters_keep_exceptions() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        import sys

        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    assert "ValueError: boom" in json.loads(JsonFormatter().format(record))["exception"]
    assert "ValueError: boom" in TextFormatter().format(record)


def test_batch_sizes_and_step_costs_per_batch_size_are_exposed() -> None:
    """``realtime_batch_size`` counts every model step by its rows, and the step time is
    kept per batch size; the engine's per-size costs and the admission's prediction are
    read at scrape time."""
    m = PrometheusObserver(process_metrics=False)
    m.model_stepped(1, 0.030)
    m.model_stepped(3, 0.036)
    m.model_stepped(3, 0.038)
    text = m.exposition().decode()
    assert value(text, "realtime_batch_size_count") == 3
    assert value(text, "realtime_batch_size_bucket", le="1.0") == 1
    assert value(text, "realtime_batch_size_bucket", le="3.0") == 3
    assert value(text, "realtime_batch_step_seconds_count", rows="3") == 2
    assert value(text, "realtime_batch_step_seconds_sum", rows="3") == pytest.approx(0.074)
    assert value(text, "realtime_batch_frames") == 0  # no engine watched
    with batching_engine(FakeModel(), capacity=2, observer=m) as engine:
        m.watch(engine)
        assert engine.try_reserve("a")
        engine.submit(Open("a", None, 1, None)).result(10)
        for _ in range(MIN_SAMPLES):
            engine.submit(Push("a", np.zeros(1280, np.float32), 16000)).result(10)
        text = m.exposition().decode()
    assert value(text, "realtime_batch_frames") == 1
    assert value(text, "realtime_batch_step_seconds_count", rows="1") == 1 + MIN_SAMPLES
    assert value(text, "realtime_engine_step_cost_seconds", rows="1") >= 0
    assert value(text, "realtime_engine_admission_cost_seconds") >= 0
