"""The app for an external ASGI server: ``hypercorn -k trio realtime.asgi:app``.

Configured from the environment (the CLI's flags have the same names):
``REALTIME_MODEL`` (checkpoint folder or Hugging Face repo id; unset: the demo
checkpoint),
``REALTIME_API_KEY`` or ``REALTIME_API_KEYS_FILE`` (read once at start: SIGHUP
reloads it under ``realtime serve`` only), ``REALTIME_SHARE_PROMPT_CACHE`` (``1``),
``REALTIME_ALLOWED_ORIGINS`` and ``REALTIME_ALLOWED_HOSTS``
(comma-separated), ``REALTIME_REPLICA_ID`` for ``--replica-id``, and one
``REALTIME_<FIELD>`` per field of :class:`realtime.limits.Limits`, e.g.
``REALTIME_IDLE_TIMEOUT`` for ``--idle-timeout``, and ``REALTIME_BATCH_FRAMES``
(``1``/``0``, ``on``/``off``; unset: batched when ``REALTIME_MAX_SESSIONS`` > 1) for
``--batch-frames``, and ``REALTIME_CPU_BLAS`` for ``--cpu-blas``. The model is loaded
on the engine thread when Hypercorn starts serving, and the thread is joined
when it stops.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from functools import partial
from typing import NoReturn

import trio

from realtime.cpu_blas import from_env, install_from
from realtime.engine.runner import EngineLoadError, watch_for_hung_calls
from realtime.errors import UsageError
from realtime.http.app import RealtimeApp, ServerState, create_app
from realtime.limits import batch_frames_from_env, limits_from_env
from realtime.session.resume import replica_id
from realtime.telemetry.logs import setup_logging
from realtime.tenants import share_from_env, tenants_from

log = logging.getLogger(__name__)


def _fail(message: str, *, engine_ran: bool = False) -> NoReturn:
    """Stop with ``message`` and a non-zero status, under Hypercorn's CLI too.

    Hypercorn runs the app in worker processes and, up to 0.18 at least, loses a
    worker's exit status: when a worker exits non-zero its ``run()`` joins the
    workers a second time over an empty list and returns 0
    (pgjones/hypercorn#269). So a worker that cannot start ends the Hypercorn
    process too, with SIGUSR1 (status 138 in a shell; there is no handler for it),
    and every other worker fails the same way on the same environment.
    ``engine_ran``: MLX has run on the engine thread (a load that failed, a warm
    prompt refused once loaded), so the exit skips MLX's static destructors, which
    may abort (ml-explore/mlx#3126), as every other exit after the engine does.
    """
    print(message, file=sys.stderr, flush=True)
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid is not None and "hypercorn" in sys.modules:
        with contextlib.suppress(OSError):
            os.kill(parent.pid, signal.SIGUSR1)
    if engine_ran:
        from realtime.server import exit_skipping_native_teardown

        exit_skipping_native_teardown(2)
    raise SystemExit(2)


async def _exit_hung(state: ServerState, reason: str) -> None:
    """A hung model call cannot be cancelled and Hypercorn cannot be told to exit
    non-zero from inside the app: after the grace in which /health answers 503, close
    the open connections and end the process with ``EXIT_ENGINE_HUNG`` for its
    supervisor to restart it."""
    from realtime.server import EXIT_ENGINE_HUNG, close_connections

    await trio.sleep(state.limits.shutdown_timeout)
    state.shutdown.set()
    await close_connections(state)
    log.critical("exiting %d: %s", EXIT_ENGINE_HUNG, reason)
    logging.shutdown()
    os._exit(EXIT_ENGINE_HUNG)


def create_app_from_env() -> RealtimeApp:
    from realtime.models import ModelPathError
    from realtime.server import engine_for, model_loader
    from realtime.warm import keeping_from, warm_prompts_from_env

    try:
        level = os.environ.get("REALTIME_LOG_LEVEL", "info").lower()
        fmt = os.environ.get("REALTIME_LOG_FORMAT", "text")
        if level not in ("debug", "info", "warning", "error") or fmt not in ("text", "json"):
            raise ValueError(
                "REALTIME_LOG_LEVEL must be debug|info|warning|error and "
                f"REALTIME_LOG_FORMAT text|json, got {level!r} and {fmt!r}"
            )
        setup_logging(level, "json" if fmt == "json" else "text")
        install_from(from_env(os.environ))
        limits = limits_from_env(os.environ)
        batch_frames = batch_frames_from_env(os.environ)
        loader = model_loader(
            os.environ.get("REALTIME_MODEL") or None, None, model_option="REALTIME_MODEL"
        )
        warm = warm_prompts_from_env(os.environ, limits.max_message_bytes)
        keeping = keeping_from(None, None, os.environ)
        try:
            replica = replica_id(os.environ.get("REALTIME_REPLICA_ID", ""))
        except ValueError as exc:
            raise ValueError(f"REALTIME_REPLICA_ID: {exc}") from None
        tenants = tenants_from(
            os.environ.get("REALTIME_API_KEYS_FILE") or None,
            os.environ.get("REALTIME_API_KEY") or None,
            share_prompt_cache=share_from_env(os.environ),
        )
        engine = engine_for(loader, limits, batch_frames=batch_frames, warm=warm, keeping=keeping)
    except (UsageError, ModelPathError, ValueError) as exc:
        _fail(f"realtime: error: {exc}")
    origins = tuple(
        o.strip() for o in os.environ.get("REALTIME_ALLOWED_ORIGINS", "").split(",") if o.strip()
    )
    state = ServerState(
        engine=engine,
        limits=limits,
        tenants=tenants,
        allowed_origins=origins,
        allowed_hosts=tuple(
            h.strip() for h in os.environ.get("REALTIME_ALLOWED_HOSTS", "").split(",") if h.strip()
        ),
        replica_id=replica,
    )
    app = create_app(state)

    @app.http.before_serving
    async def load() -> None:
        try:
            await trio.to_thread.run_sync(engine.start)
        except EngineLoadError as exc:
            # Before: a traceback, and Hypercorn went on serving with no model.
            _fail(f"realtime: error: could not load the model: {exc}", engine_ran=True)
        app.http.nursery.start_soon(
            watch_for_hung_calls, engine, limits.max_step_seconds, partial(_exit_hung, state)
        )

    @app.http.after_serving
    async def stop() -> None:
        state.shutdown.set()
        with trio.move_on_after(3.0):
            await state.idle.wait()
        await trio.to_thread.run_sync(engine.shutdown)
        # Everything of ours is shut down and the engine joined; the worker now returns
        # to Hypercorn and exits. MLX used from a thread other than the main one can abort
        # in its static destructors at interpreter exit (ml-explore/mlx#3126): the first
        # exit handler to run ends the process before them, as `realtime serve` does.
        from realtime.server import exit_skipping_native_teardown

        atexit.register(exit_skipping_native_teardown, 0)

    return app


app = create_app_from_env()
