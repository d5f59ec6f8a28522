"""The app for an external ASGI server: ``hypercorn -k trio realtime.asgi:app``.

Configured from the environment (the CLI's flags have the same names):
``REALTIME_MODEL`` (checkpoint folder; unset: the demo checkpoint),
``REALTIME_API_KEY``, ``REALTIME_ALLOWED_ORIGINS`` (comma-separated) and the
limits ``REALTIME_MAX_MESSAGE_BYTES``, ``REALTIME_MAX_PENDING_AUDIO_SECONDS``,
``REALTIME_CONFIGURE_TIMEOUT``, ``REALTIME_IDLE_TIMEOUT``,
``REALTIME_SEND_TIMEOUT``, ``REALTIME_SEND_QUEUE_EVENTS``. The model is loaded
on the engine thread when Hypercorn starts serving, and the thread is joined
when it stops.
"""

from __future__ import annotations

import logging
import os

import attrs
import trio

from realtime.app import RealtimeApp, ServerState, create_app
from realtime.engine import Engine
from realtime.limits import Limits

log = logging.getLogger("realtime")


def limits_from_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> Limits:
    values: dict[str, object] = {}
    for field in attrs.fields(Limits):
        raw = environ.get(f"REALTIME_{field.name.upper()}")
        if raw is None:
            continue
        kind = int if field.type in (int, "int") else float
        try:
            value = kind(raw)
        except ValueError:
            raise ValueError(
                f"REALTIME_{field.name.upper()} must be a number, got {raw!r}"
            ) from None
        if not value > 0:
            raise ValueError(f"REALTIME_{field.name.upper()} must be > 0, got {raw!r}")
        values[field.name] = value
    return Limits(**values)  # type: ignore[arg-type]


def create_app_from_env() -> RealtimeApp:
    from realtime.cli import CliError
    from realtime.server import model_loader

    logging.basicConfig(level=os.environ.get("REALTIME_LOG_LEVEL", "INFO").upper())
    try:
        engine = Engine(model_loader(os.environ.get("REALTIME_MODEL") or None, None))
        limits = limits_from_env()
    except (CliError, ValueError) as exc:
        raise SystemExit(f"realtime: error: {exc}") from None
    origins = tuple(
        o.strip() for o in os.environ.get("REALTIME_ALLOWED_ORIGINS", "").split(",") if o.strip()
    )
    state = ServerState(
        engine=engine,
        limits=limits,
        api_key=os.environ.get("REALTIME_API_KEY") or None,
        allowed_origins=origins,
    )
    app = create_app(state)

    @app.http.before_serving
    async def load() -> None:
        await trio.to_thread.run_sync(engine.start)

    @app.http.after_serving
    async def stop() -> None:
        state.shutdown.set()
        with trio.move_on_after(3.0):
            await state.idle.wait()
        await trio.to_thread.run_sync(engine.shutdown)

    return app


app = create_app_from_env()
