"""Launching: load the model on the engine thread, then serve the app with Hypercorn.

The model loads before any port is bound, so a bad checkpoint exits with code 2
and a one-line message. SIGINT/SIGTERM close an active session with 1001,
release it, stop Hypercorn and join the engine thread.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import Framework

from realtime.app import ServerState, create_app
from realtime.cli import CliError
from realtime.engine import Engine, EngineLoadError
from realtime.limits import Limits
from realtime.models.base import RealtimeModel

log = logging.getLogger("realtime")

SHUTDOWN_GRACE_SECONDS = 3.0


def hypercorn_config(host: str, port: int, limits: Limits) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    # Messages between our limit and twice it get a clear error event from the
    # connection; only far larger ones are cut off by Hypercorn (close 1009).
    config.websocket_max_message_size = 2 * limits.max_message_bytes + 65536
    config.graceful_timeout = SHUTDOWN_GRACE_SECONDS
    config.accesslog = None
    return config


def model_loader(model: str | None, quantize: int | None) -> Callable[[], RealtimeModel]:
    """The loader the engine thread runs: the given checkpoint (checked here, before
    any thread starts, so a bad path exits 2 at once), or the demo checkpoint, which
    is built on the engine thread too since building it runs MLX."""
    from realtime.models import ModelPathError, check_model_path, load_model

    if model is None:
        log.warning(
            "no -m given: serving the built-in DEMO checkpoint. It has random weights: "
            "it exercises the whole pipeline but speaks noise and writes gibberish. "
            "Pass -m PATH to serve a real VoiceChat checkpoint."
        )

        def load_demo() -> RealtimeModel:
            from realtime.models.demo import ensure_demo_checkpoint

            path = ensure_demo_checkpoint(quantize=quantize)
            log.info("demo checkpoint: %s", path)
            return load_model(path)

        return load_demo
    if quantize is not None:
        raise CliError("--quantize applies to the demo model only (omit -m)")
    try:
        info = check_model_path(model)
    except ModelPathError as exc:
        raise CliError(str(exc)) from None
    return lambda: load_model(info.path)


def start_engine(loader: Callable[[], RealtimeModel]) -> Engine:
    engine = Engine(loader)
    started = time.perf_counter()
    try:
        model = engine.start()
    except EngineLoadError as exc:
        raise CliError(f"could not load the model: {exc}") from None
    log.info("serving model %s (loaded in %.1f s)", model.model_id, time.perf_counter() - started)
    return engine


async def run_server(
    state: ServerState,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until ``shutdown_trigger`` returns (default: SIGINT or SIGTERM).

    Connections are told to close (1001) first, so sessions end and release
    before Hypercorn stops.
    """
    app = create_app(state)
    stop = trio.Event()

    async def graceful() -> None:
        await stop.wait()

    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            if shutdown_trigger is None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        log.info("received %s; shutting down", signal.Signals(signum).name)
                        break
            else:
                await shutdown_trigger()
            state.shutdown.set()
            with trio.move_on_after(SHUTDOWN_GRACE_SECONDS):
                await state.idle.wait()
            stop.set()

        nursery.start_soon(watch)
        binds = await nursery.start(
            lambda task_status: serve(
                cast("Framework", app),  # a plain ASGI callable; Hypercorn's types are narrower
                config,
                shutdown_trigger=graceful,
                task_status=task_status,
            )
        )
        task_status.started(binds)
        await stop.wait()


def _ws_urls(binds: list[str]) -> list[str]:
    return [
        b.replace("http://", "ws://").replace("https://", "wss://") + "/v1/realtime" for b in binds
    ]


def _first(exc: BaseException, kind: type[OSError]) -> OSError | None:
    if isinstance(exc, kind):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _first(inner, kind)
            if found is not None:
                return found
    return None


def serve_command(args: argparse.Namespace, limits: Limits) -> int:
    engine = start_engine(model_loader(args.model, args.quantize))
    state = ServerState(
        engine=engine,
        limits=limits,
        api_key=args.api_key,
        allowed_origins=tuple(args.allowed_origin),
    )
    config = hypercorn_config(args.host, args.port, limits)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run_server, state, config)
            for url in _ws_urls(binds):
                print(f"realtime: serving {url}", file=sys.stderr, flush=True)

    try:
        trio.run(main)
    except (OSError, BaseExceptionGroup) as exc:
        os_error = _first(exc, OSError)
        if os_error is None:
            raise
        raise CliError(
            f"cannot listen on {args.host}:{args.port}: {os_error.strerror or os_error}"
        ) from None
    finally:
        engine.shutdown()
    log.info("stopped")
    _exit_skipping_native_teardown(0)
    return 0


def _exit_skipping_native_teardown(code: int) -> None:
    """End the process now that every session is closed and the engine joined.

    MLX used from a thread other than the main one can abort in its static
    destructors at interpreter exit ("terminate called without an active
    exception", ml-explore/mlx#3126); everything of ours is already shut down,
    so skip that teardown and exit with the real status.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
