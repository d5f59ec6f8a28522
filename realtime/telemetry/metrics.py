"""Prometheus metrics for ``/metrics``, filled through the :mod:`realtime.observe` hooks.

Each :class:`PrometheusObserver` owns its own ``CollectorRegistry`` (never the
global one), so one process can hold several servers (tests do) without
duplicate-metric errors. prometheus-client's metrics are thread-safe and cost
about a microsecond to update, which is why the hooks may call them directly
on the per-frame path and on the engine thread. Values that already live
somewhere else (engine alive, the model's identity) are read at scrape time
instead of being pushed.
"""

from __future__ import annotations

import importlib.metadata
import logging
import platform
from collections.abc import Callable, Iterable
from typing import Final, get_args

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from realtime import __version__, cpu_blas
from realtime.endpoints import ErrorCode
from realtime.engine.runner import Engine
from realtime.models.prompt_cache import CachesPrompts
from realtime.observe import (
    CommandKind,
    DropReason,
    ErrorPlace,
    HTTPRefusalReason,
    Observer,
    RefusalReason,
    SessionOutcome,
    SessionReport,
)

log = logging.getLogger("realtime.telemetry.metrics")

__all__ = ["CONTENT_TYPE", "PrometheusObserver"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

ERROR_CODES: Final = get_args(ErrorCode)
"""Pre-declared so each series exists (at 0) before the first error: rates need that."""

# One frame is 80 ms of audio: the buckets are dense around that budget.
STEP_BUCKETS: Final = (
    0.0025, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.12, 0.16, 0.25, 0.5, 1.0,
)  # fmt: skip
LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.16, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip
LATENESS_BUCKETS: Final = (
    -0.08,
    -0.06,
    -0.04,
    -0.02,
    -0.01,
    0.0,
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
)
"""Seconds after a frame's deadline (negative: before it), around one 80 ms frame."""
OPEN_BUCKETS: Final = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS: Final = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
"""Rows of one model step: every size up to 4, then coarser (``--max-sessions`` bounds it)."""


def _declared_counter(
    name: str, documentation: str, label: str, values: Iterable[str], registry: CollectorRegistry
) -> Counter:
    """A counter by one label whose every value is declared up front, so each series
    exists (at 0) before its first event: rates need that."""
    counter = Counter(name, documentation, [label], registry=registry)
    for value in values:
        counter.labels(value)
    return counter


class PrometheusObserver(Observer):
    """Every server metric, on one private registry; ``exposition()`` is the scrape body."""

    def __init__(self, *, process_metrics: bool = True) -> None:
        # No ``*_created`` series beside every counter and histogram: they double
        # the exposition and no dashboard reads them (process-wide switch).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        r = self.registry
        self._engine: Engine | None = None
        self._draining: Callable[[], bool] = lambda: False

        self.sessions = _declared_counter(
            "realtime_sessions",
            "Sessions that ended, by how they ended.",
            "outcome",
            get_args(SessionOutcome),
            r,
        )
        self.active_sessions = Gauge(
            "realtime_active_sessions",
            "Sessions holding one of the engine's slots now (at most realtime_sessions_capacity).",
            registry=r,
        )
        # The same figures by tenant, where keys are asked for (the series above stay
        # the server's totals): a series appears with a tenant's first session.
        self.tenant_sessions = Counter(
            "realtime_tenant_sessions",
            "Sessions that ended, by tenant (whose API key opened it) and how they ended.",
            ["tenant", "outcome"],
            registry=r,
        )
        self.tenant_active_sessions = Gauge(
            "realtime_tenant_active_sessions",
            "Sessions holding a slot now, by tenant (at most its max_sessions).",
            ["tenant"],
            registry=r,
        )
        self.tenant_refusals = Counter(
            "realtime_tenant_connections_refused",
            "WebSocket connections with a valid key that got no session, by tenant and "
            "why (tenant_limit: the tenant's own max_sessions; busy, overloaded: the "
            "server's).",
            ["tenant", "reason"],
            registry=r,
        )
        self.frames_late = Counter(
            "realtime_engine_frames_late",
            "Frame steps that finished after their deadline (one frame time after the "
            "frame reached the engine): the engine did not keep up with every session.",
            registry=r,
        )
        self.frame_lateness = Histogram(
            "realtime_engine_frame_lateness_seconds",
            "When a frame step finished, relative to its deadline (0: just in time; "
            "the buckets below 0 are frames in time, by how much).",
            buckets=LATENESS_BUCKETS,
            registry=r,
        )
        self.refusals = _declared_counter(
            "realtime_connections_refused",
            "WebSocket connections that got no session (busy slot: close 1013; "
            "refused upgrade: HTTP 401/403/503).",
            "reason",
            get_args(RefusalReason),
            r,
        )
        self.http_refusals = _declared_counter(
            "realtime_http_requests_refused",
            "Plain HTTP requests refused before any route ran (401 key, 403 Host).",
            "reason",
            get_args(HTTPRefusalReason),
            r,
        )
        self.connection_errors = _declared_counter(
            "realtime_connection_errors",
            "Connections ended by an exception (logged once each; no other connection "
            "is touched): in Hypercorn's tasks for the connection, or in the app.",
            "where",
            get_args(ErrorPlace),
            r,
        )
        self.limit_refusals = Counter(
            "realtime_limit_refusals",
            "Client messages refused by a per-connection limit.",
            ["limit"],
            registry=r,
        )
        self.errors = _declared_counter(
            "realtime_error_events",
            "error events sent to clients, by code.",
            "code",
            ERROR_CODES,
            r,
        )
        self.model_step = Histogram(
            "realtime_model_step_seconds",
            "Engine-thread time of one audio slice (one 80 ms frame) through the model.",
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "realtime_batch_size",
            "Frames (one per conversation) in each model step: 1 when time-sliced "
            "(--no-batch-frames), up to the conversations with a frame due when batched.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.batch_step = Summary(
            "realtime_batch_step_seconds",
            "Engine time of one model step, by its rows (batch size): the mean step per "
            "batch size is sum over count.",
            ["rows"],
            registry=r,
        )
        self.frame_latency = Histogram(
            "realtime_frame_latency_seconds",
            "Server-side frame latency: audio append received until that frame's audio "
            "was handed to the socket.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.session_open = Histogram(
            "realtime_session_open_seconds",
            "Time to open a session on the engine (warm-up and prompt prefill).",
            buckets=OPEN_BUCKETS,
            registry=r,
        )
        self.resume_seconds = Histogram(
            "realtime_resume_seconds",
            "Time to resume a conversation: the resume connection's upgrade until its "
            "session.resumed was sent (the journal's replay follows).",
            buckets=OPEN_BUCKETS,
            registry=r,
        )
        self._pending_audio: dict[str, float] = {}
        self._send_queue: dict[str, int] = {}
        self._frames = 0
        """Per-frame figures kept as plain attributes (one store each, no lock: only the
        trio thread writes them) and reported when Prometheus scrapes."""
        self.stalled_drops = Counter(
            "realtime_stalled_client_drops",
            "Sessions dropped because the client stopped reading (send timeout).",
            registry=r,
        )
        self.input_audio_dropped_seconds = _declared_counter(
            "realtime_input_audio_dropped_seconds",
            "Seconds of client input audio dropped over the backlog bound, by why: the "
            "model was still opening (the oldest went), the engine was behind, or the "
            "client sent faster than real time.",
            "reason",
            get_args(DropReason),
            r,
        )
        r.register(_ScrapeTime(self))
        if process_metrics:
            # RSS, open descriptors, CPU seconds (Linux /proc), Python version, GC.
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            GCCollector(registry=r)

    def watch(self, engine: Engine, *, draining: Callable[[], bool] | None = None) -> None:
        """Read engine liveness, the model's identity and the drain state at scrape time."""
        self._engine = engine
        if draining is not None:
            self._draining = draining

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric (the ``/metrics`` body)."""
        return generate_latest(self.registry)

    # --- hooks ----------------------------------------------------------------------

    def command_finished(self, kind: CommandKind, seconds: float) -> None:
        if kind == "push":
            self.model_step.observe(seconds)

    def connection_refused(self, reason: RefusalReason, tenant: str | None = None) -> None:
        self.refusals.labels(reason).inc()
        if tenant is not None:
            self.tenant_refusals.labels(tenant, reason).inc()

    def http_refused(self, reason: HTTPRefusalReason) -> None:
        self.http_refusals.labels(reason).inc()

    def connection_error(self, where: ErrorPlace) -> None:
        self.connection_errors.labels(where).inc()

    def session_started(self, session_id: str, tenant: str | None = None) -> None:
        self.active_sessions.inc()
        if tenant is not None:
            self.tenant_active_sessions.labels(tenant).inc()

    def session_opened(self, seconds: float) -> None:
        self.session_open.observe(seconds)

    def session_ended(self, report: SessionReport) -> None:
        self.active_sessions.dec()
        self.sessions.labels(report.outcome).inc()
        if report.tenant is not None:
            self.tenant_active_sessions.labels(report.tenant).dec()
            self.tenant_sessions.labels(report.tenant, report.outcome).inc()
        if report.outcome == "stalled_client":
            self.stalled_drops.inc()
        # Nothing is pending or queued once the session is gone.
        self._pending_audio.pop(report.session_id, None)
        self._send_queue.pop(report.session_id, None)

    def session_resumed(self, session_id: str, seconds: float, replayed: int) -> None:
        self.sessions.labels("resumed").inc()
        self.resume_seconds.observe(seconds)

    def error_sent(self, code: str) -> None:
        self.errors.labels(code).inc()

    def limit_refused(self, limit: str) -> None:
        self.limit_refusals.labels(limit).inc()

    def input_audio_dropped(self, reason: DropReason, seconds: float) -> None:
        self.input_audio_dropped_seconds.labels(reason).inc(seconds)

    def frame_sent(self, latency: float) -> None:
        self._frames += 1
        self.frame_latency.observe(latency)

    def pending_audio(self, session_id: str, seconds: float) -> None:
        self._pending_audio[session_id] = seconds

    def send_queue(self, session_id: str, depth: int) -> None:
        self._send_queue[session_id] = depth

    def frame_deadline(self, lateness: float, queued: int) -> None:
        if lateness > 0:
            self.frames_late.inc()
        self.frame_lateness.observe(lateness)

    def model_stepped(self, rows: int, seconds: float) -> None:
        self.batch_size.observe(rows)
        self.batch_step.labels(str(rows)).observe(seconds)


def _prompt_cache(engine: Engine | None) -> Iterable[Metric]:
    """The model's prompt-state cache (--prompt-cache-bytes), when it keeps one."""
    model = engine.loaded_model if engine is not None else None
    if not isinstance(model, CachesPrompts):
        return
    figures = model.prompt_cache_figures()
    yield CounterMetricFamily(
        "realtime_prompt_cache_hits",
        "Openings whose system prompt's state was copied from the prompt cache.",
        value=figures.hits,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_misses",
        "Openings that read their system prompt through the model (or shared such a read).",
        value=figures.misses,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_shared",
        "Of the misses, openings that shared another opening's read of the same prompt.",
        value=figures.shared,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_evictions",
        "Prompt states dropped to stay within --prompt-cache-bytes.",
        value=figures.evictions,
    )
    yield GaugeMetricFamily(
        "realtime_prompt_cache_bytes",
        "Memory held by the prompt cache's states.",
        value=figures.bytes,
    )
    yield GaugeMetricFamily(
        "realtime_prompt_cache_entries",
        "Prompt states held (each prompt keeps a language part and a voice part).",
        value=figures.entries,
    )
    yield GaugeMetricFamily(
        "realtime_prompt_cache_voice_chain_tokens",
        "Steps of the default seed's voice chain held (built ahead to "
        "--max-system-prompt-tokens at idle priority).",
        value=figures.voice_chain_tokens,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_ahead_seconds",
        "Engine time spent on work no opening waited for (building ahead, writing files).",
        value=figures.ahead_seconds,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_disk_reads",
        "Prompt states read from --state-cache-dir and used.",
        value=figures.disk_reads,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_disk_writes",
        "Prompt states written to --state-cache-dir.",
        value=figures.disk_writes,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_orphans_finished",
        "Prompt reads whose clients left, finished at idle priority so a retry hits "
        "(their engine time is in realtime_prompt_cache_ahead_seconds).",
        value=figures.orphans_finished,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_orphans_dropped",
        "Prompt reads whose clients left, dropped (failed, or over their engine-time bound).",
        value=figures.orphans_dropped,
    )
    yield CounterMetricFamily(
        "realtime_prompt_cache_disk_ignored",
        "State files found but not trusted (corrupt, or another checkpoint's or version's).",
        value=figures.disk_ignored,
    )


class _ScrapeTime(Collector):
    """Values read when Prometheus scrapes: engine alive, draining, slot, build info."""

    def __init__(self, owner: PrometheusObserver) -> None:
        self._owner = owner
        self._build: dict[str, str] | None = None

    def describe(self) -> Iterable[Metric]:
        return []  # collected fresh each scrape; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        engine = self._owner._engine
        owner = self._owner
        step = engine.step_p90 if engine is not None else None
        predicted = engine.admission_cost() if engine is not None else None
        gauges: tuple[tuple[str, str, float], ...] = (
            (
                "realtime_engine_alive",
                "1 while the model engine thread runs.",
                float(engine is not None and engine.alive),
            ),
            (
                "realtime_draining",
                "1 once the server drains (SIGTERM): no new conversations.",
                float(owner._draining()),
            ),
            (
                "realtime_slot_reserved",
                "1 while any session holds one of the engine's slots.",
                float(engine is not None and engine.is_reserved()),
            ),
            (
                "realtime_sessions_capacity",
                "Conversations this server serves at once (--max-sessions).",
                float(engine.capacity if engine is not None else 0),
            ),
            (
                "realtime_sessions_reserved",
                "Engine slots held now (a slot frees once the engine has closed its session).",
                float(engine.reserved if engine is not None else 0),
            ),
            (
                "realtime_engine_queue_depth",
                "Commands waiting for the engine thread, all sessions together.",
                float(engine.queue_depth if engine is not None else 0),
            ),
            (
                "realtime_engine_step_p90_seconds",
                "p90 of the engine's recent model steps, any batch size (time-sliced: what "
                "admission by load reads; NaN until enough frames ran).",
                float("nan") if step is None else step,
            ),
            (
                "realtime_batch_frames",
                "1 when the frames that are due run as one batched model step (--batch-frames).",
                float(engine is not None and engine.batch_frames),
            ),
        )
        for name, documentation, value in gauges:
            yield GaugeMetricFamily(name, documentation, value=value)
        costs = GaugeMetricFamily(
            "realtime_engine_step_cost_seconds",
            "p90 of the engine's recent model steps per batch size (rows), for the sizes "
            "measured often enough: what admission by load predicts from.",
            labels=["rows"],
        )
        for rows, cost in (engine.step_costs if engine is not None else {}).items():
            costs.add_metric([str(rows)], cost)
        yield costs
        yield GaugeMetricFamily(
            "realtime_engine_admission_cost_seconds",
            "Predicted engine time of one frame of every open conversation and one more: "
            "a new one is refused while it exceeds --admission-margin x the frame time "
            "(NaN until enough frames ran).",
            value=float("nan") if predicted is None else predicted,
        )
        yield from _prompt_cache(engine)
        yield CounterMetricFamily(
            "realtime_frames",
            "Model frames (80 ms each) whose audio was handed to a client's socket.",
            value=owner._frames,
        )
        for name, documentation, value in (
            (
                "realtime_pending_input_audio_seconds",
                "Input audio accepted from the client and not yet run by the model.",
                sum(owner._pending_audio.values()),
            ),
            (
                "realtime_send_queue_events",
                "Events queued for the client's socket.",
                sum(owner._send_queue.values()),
            ),
        ):
            yield GaugeMetricFamily(name, documentation, value=value)
        info = InfoMetricFamily("realtime_build", "Version, model and MLX build of this server.")
        info.add_metric([], self._build_info(engine))
        yield info

    def _build_info(self, engine: Engine | None) -> dict[str, str]:
        if self._build is not None:
            return self._build
        model = engine.loaded_model if engine is not None else None
        labels = {
            "version": __version__,
            "model": model.model_id if model is not None else "",
            "quantization": _quantization(model.path if model is not None else None),
            "mlx_version": _package_version("mlx"),
            "mlx_backend": _mlx_backend(),
            "cpu_blas": cpu_blas.active().name,
            "python_version": platform.python_version(),
        }
        if model is not None:
            self._build = labels  # fixed once the model is loaded
        return labels


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _quantization(path: str | None) -> str:
    """``bf16``/``float32``-style "none", or ``4bit``/``8bit`` from the checkpoint's config."""
    if path is None:
        return ""
    try:
        from realtime.models import check_model_path

        bits = check_model_path(path).quantization_bits
    except Exception:
        log.debug("no quantization info for %s", path, exc_info=True)
        return ""
    return f"{bits}bit" if bits else "none"


def _mlx_backend() -> str:
    """Which MLX device the engine computes on; queries only, no MLX work."""
    try:
        import mlx.core as mx

        if mx.metal.is_available():
            return "metal"
        cuda = getattr(mx, "cuda", None)
        if cuda is not None and cuda.is_available():
            return "cuda"
        return "cpu"
    except Exception:
        return ""
