"""The app for an external ASGI server: ``hypercorn -k trio realtime.asgi:app``.

Configured from the environment (the CLI's flags have the same names):
``REALTIME_MODEL`` (checkpoint folder; unset: the demo checkpoint),
``REALTIME_API_KEY``, ``REALTIME_ALLOWED_ORIGINS`` (comma-separated) and one
``REALTIME_<FIELD>`` per field of :class:`realtime.limits.Limits`, e.g.
``REALTIME_IDLE_TIMEOUT`` for ``--idle-timeout``. The model is loaded
on the engine thread when Hypercorn starts serving, and the thread is joined
when it stops.
"""

from __future__ import annotations

import logging
import os

import trio

from realtime.app import RealtimeApp, ServerState, create_app
from realtime.engine import Engine
from realtime.errors import UsageError
from realtime.limits import limits_from_env

log = logging.getLogger("realtime")


def create_app_from_env() -> RealtimeApp:
    from realtime.models import ModelPathError
    from realtime.server import model_loader

    logging.basicConfig(level=os.environ.get("REALTIME_LOG_LEVEL", "INFO").upper())
    try:
        engine = Engine(model_loader(os.environ.get("REALTIME_MODEL") or None, None))
        limits = limits_from_env(os.environ)
    except (UsageError, ModelPathError, ValueError) as exc:
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
