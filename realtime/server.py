"""Launching: bind the port, load the model on the engine thread, serve with Hypercorn.

A bad checkpoint path and a port in use both exit with code 2 and a one-line
message before the (possibly long) model load. SIGTERM drains first (see
:func:`run_server`); then, as on SIGINT, an active session is closed with 1001
and released, Hypercorn stops and the engine thread is joined.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import cast

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import Framework

from realtime.endpoints import LIVE_PATH, NATIVE_PATH, OPENAI_PATH
from realtime.engine.runner import Engine, EngineLoadError, watch_for_hung_calls
from realtime.errors import UsageError
from realtime.http.app import ServerState, create_app
from realtime.limits import Limits, batching
from realtime.models.base import RealtimeModel
from realtime.observe import Observer, Observers
from realtime.telemetry.logs import SessionLog
from realtime.telemetry.metrics import PrometheusObserver
from realtime.telemetry.recording import Recording, share_of
from realtime.tenants import Tenants, tenants_from
from realtime.warm import (
    NO_KEEPING,
    Keeping,
    WarmPrompt,
    keeping_from,
    preparing,
    read_warm_prompts,
    warm_prompts_from_env,
)

log = logging.getLogger(__name__)

ABORT_GRACE_SECONDS = 2.0
"""After aborting the sockets of connections that did not close in time: how long
their handlers get to finish (they end at once; this only bounds a surprise)."""

READ_TIMEOUT_SECONDS = 300
"""Hypercorn's ``read_timeout``: a connection that sends nothing for this long is
closed, whatever it is (a half-open TCP peer that is gone). Far above any quiet
period of a live client (it streams audio; the app's own idle and stalled-reader
clocks end a conversation long before). Hypercorn's WebSocket pings are left off:
with them a refused upgrade's close reached a browser only seconds later."""
EXIT_ENGINE_HUNG = 3
"""Exit status of ``realtime serve`` after a model call hung (--max-step-seconds)."""
KEEP_ALIVE_SECONDS = 5
"""An idle keep-alive HTTP connection is closed after this long (Hypercorn's default,
stated here so ``realtime serve`` and the documented ``hypercorn`` flags agree)."""


def hypercorn_config(host: str, port: int, limits: Limits) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    # Messages between our limit and twice it get a clear error event from the
    # connection; only far larger ones are cut off by Hypercorn (close 1009).
    config.websocket_max_message_size = 2 * limits.max_message_bytes + 65536
    # Hypercorn cancels its connection handlers this long after it stops accepting;
    # ours have closed (or been aborted) by then, see run_server.
    config.graceful_timeout = limits.shutdown_timeout + ABORT_GRACE_SECONDS
    config.read_timeout = READ_TIMEOUT_SECONDS
    config.keep_alive_timeout = KEEP_ALIVE_SECONDS
    config.accesslog = None
    # Hypercorn's own handler plus propagation to ours printed "Running on" twice:
    # hand it a plain logger so its lines go through our (text or JSON) handler once.
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def bind_now(config: Config) -> None:
    """Bind the listening sockets now and hand them to Hypercorn by descriptor.

    Run before the model loads, so a port in use fails at once (OSError), not
    after minutes of loading an 11B checkpoint; holding the socket also means
    nothing can take the port meanwhile.
    """
    sockets = config.create_sockets()
    config.bind = [f"fd://{sock.detach()}" for sock in sockets.insecure_sockets]


def _close_bound(config: Config) -> None:
    for bind in config.bind:
        if bind.startswith("fd://"):
            try:
                socket.socket(fileno=int(bind[5:])).close()
            except OSError:
                pass


def model_loader(
    model: str | None,
    quantize: int | None,
    *,
    model_option: str = "-m",
    demo_turns: bool | None = None,
) -> Callable[[], RealtimeModel]:
    """The loader the engine thread runs: the given checkpoint (a folder, or a Hugging
    Face repo id downloaded here; checked here, before any thread starts, so a bad path
    exits 2 at once), or the demo checkpoint, which is built on the engine thread too
    since building it runs MLX. ``model_option`` names the setting in messages
    (``REALTIME_MODEL`` under the Hypercorn CLI). The demo takes turns by the energy
    policy of :mod:`realtime.demo.turns` unless ``demo_turns`` is False (the raw
    random network); a real checkpoint is never wrapped."""
    from realtime.models import ModelPathError, check_model_path, load_model
    from realtime.models.hub import resolve_model

    if model is None:
        turns = demo_turns is not False
        log.warning(
            "no %s given: serving the built-in DEMO checkpoint. It has random weights: "
            "it exercises the whole pipeline but speaks noise%s. "
            "Set %s to a VoiceChat checkpoint folder or Hugging Face repo id "
            "(e.g. mlx-community/NemotronLabs-VoiceChat-11B-4bit) to serve a real one.",
            model_option,
            "; its scripted turns answer speech after you stop (--no-demo-turns: the raw "
            "network, which writes gibberish)"
            if turns
            else " and writes gibberish",
            model_option if model_option != "-m" else "-m PATH",
        )

        def load_demo() -> RealtimeModel:
            from realtime.demo.checkpoint import ensure_demo_checkpoint
            from realtime.demo.turns import demo_turns as with_turns

            path = ensure_demo_checkpoint(quantize=quantize)
            log.info("demo checkpoint: %s%s", path, "" if turns else " (raw, no demo turns)")
            loaded = load_model(path)
            return with_turns(loaded) if turns else loaded

        return load_demo
    if quantize is not None:
        raise UsageError("--quantize applies to the demo model only (omit -m)")
    if demo_turns is not None:
        raise UsageError("--[no-]demo-turns applies to the demo model only (omit -m)")
    try:
        info = check_model_path(resolve_model(model))
    except ModelPathError as exc:
        raise UsageError(str(exc)) from None
    return lambda: load_model(info.path)


def engine_for(
    loader: Callable[[], RealtimeModel],
    limits: Limits,
    observer: Observer | None = None,
    *,
    batch_frames: bool | None = None,
    warm: Sequence[WarmPrompt] = (),
    keeping: Keeping = NO_KEEPING,
) -> Engine:
    """The engine the limits ask for: ``max_sessions`` slots, admission by load past one
    (``admission_margin``) only when more than one conversation may run, and batched
    frames as ``batch_frames`` says (``None``: on past one conversation,
    :func:`realtime.limits.batching`). With admission by load the engine measures its
    step before it reports ready (``Engine.warm_up``), so ``/ready`` and the first
    clients are answered by measurement. Its loader also bounds the model's prompt cache
    and warms ``warm`` into it, its states kept as ``keeping`` says
    (:func:`realtime.warm.preparing`)."""
    margin = limits.admission_margin if limits.max_sessions > 1 else 0.0
    return Engine(
        preparing(loader, limits, warm, keeping),
        observer=observer,
        capacity=limits.max_sessions,
        admission_margin=margin,
        batch_frames=batching(batch_frames, limits.max_sessions),
        warm_up=margin > 0,
    )


def start_engine(
    loader: Callable[[], RealtimeModel],
    observer: Observer | None = None,
    limits: Limits | None = None,
    *,
    batch_frames: bool | None = None,
    warm: Sequence[WarmPrompt] = (),
    keeping: Keeping = NO_KEEPING,
) -> Engine:
    """Load the model on a new engine thread (serving ``limits.max_sessions``
    conversations); the engine once it is ready.

    A failed load is a usage error (exit 2). Ctrl-C during the load ends the process
    here, at once, with status 130 (a shell's 128 + SIGINT) and one line: the load
    cannot be cancelled, and waiting for it made one SIGINT hang the process. The
    exit skips the interpreter's teardown, which could abort in MLX code still running
    on the loading thread (ml-explore/mlx#3126). SIGTERM has no handler before
    serving, so its default action ends a loading process as it always has.
    """
    engine = engine_for(
        loader,
        limits or Limits(),
        observer,
        batch_frames=batch_frames,
        warm=warm,
        keeping=keeping,
    )
    started = time.perf_counter()
    try:
        model = engine.start()
    except EngineLoadError as exc:
        raise UsageError(f"could not load the model: {exc}") from None
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C: no traceback
        print(
            "realtime: interrupted (SIGINT) while the model was loading; exiting",
            file=sys.stderr,
            flush=True,
        )
        exit_skipping_native_teardown(128 + signal.SIGINT)
        raise  # not reached: the process has ended
    log.info("serving model %s (loaded in %.1f s)", model.model_id, time.perf_counter() - started)
    return engine


async def run_server(
    state: ServerState,
    config: Config,
    *,
    shutdown_trigger: Callable[[], Awaitable[None]] | None = None,
    drain_timeout: float | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until SIGINT or SIGTERM (or until ``shutdown_trigger`` returns).

    SIGTERM with ``drain_timeout`` > 0 (default: ``state.limits.drain_timeout``; and a
    returning ``shutdown_trigger``) drains first: ``state.draining`` is set, so
    ``/ready`` answers 503 and new upgrades get HTTP 503, while the open conversation
    may finish for up to ``drain_timeout`` seconds. A second SIGTERM, a SIGINT, or
    ``state.shutdown`` being set ends the drain early. Then connections are told to
    close (1001), so sessions end and release before Hypercorn stops. A connection
    still open ``state.limits.shutdown_timeout`` seconds later (a client that reads
    nothing, so Hypercorn's shielded write to it never ends) has its TCP connection
    aborted, which ends that write; so the whole shutdown is bounded whatever the
    clients do.

    SIGHUP reloads the keys file (:func:`reload_keys_on_sighup`); it is watched from
    before the port answers, wherever signals are this server's (no
    ``shutdown_trigger``, or a keys file to reload).
    """
    if drain_timeout is None:
        drain_timeout = state.limits.drain_timeout
    app = create_app(state)
    stop = trio.Event()

    async def graceful() -> None:
        await stop.wait()

    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            if shutdown_trigger is None:
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    signum = await _next_signal(signals)
                    name = signal.Signals(signum).name
                    if signum == signal.SIGTERM and drain_timeout > 0:
                        log.info(
                            "received %s; draining for up to %.0f s (signal again to stop now)",
                            name,
                            drain_timeout,
                        )
                        async with trio.open_nursery() as inner:

                            async def second_signal() -> None:
                                again = await _next_signal(signals)
                                log.info(
                                    "received %s; ending the drain", signal.Signals(again).name
                                )
                                state.shutdown.set()

                            inner.start_soon(second_signal)
                            await drain(state, drain_timeout)
                            inner.cancel_scope.cancel()
                    else:
                        log.info("received %s; shutting down", name)
            else:
                await shutdown_trigger()
                if drain_timeout > 0:
                    await drain(state, drain_timeout)
            state.shutdown.set()
            await close_connections(state)
            stop.set()

        nursery.start_soon(watch)
        watcher = trio.CancelScope()

        async def watch_hung() -> None:
            with watcher:
                await _stop_when_hung(state, stop)

        nursery.start_soon(watch_hung)
        reloader = trio.CancelScope()

        async def watch_reloads(task_status: trio.TaskStatus[None]) -> None:
            with reloader:
                await reload_keys_on_sighup(state.tenants, task_status=task_status)

        keys_file = state.tenants is not None and state.tenants.source is not None
        if shutdown_trigger is None or keys_file:  # signals are the main thread's
            await nursery.start(watch_reloads)  # SIGHUP is ours before the port answers
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
        watcher.cancel()  # it watches while the engine lives, which outlasts serving
        reloader.cancel()


async def reload_keys_on_sighup(
    tenants: Tenants | None, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Read the keys file again on every SIGHUP: the new keys are in force for the next
    request; open connections stay as they are. A bad file is one log line and the
    keys in force are kept. Without a keys file SIGHUP is logged and ignored (its
    default action would end the server: ``systemctl reload`` must not)."""
    with trio.open_signal_receiver(signal.SIGHUP) as signals:
        task_status.started()
        async for _ in signals:
            if tenants is None or tenants.source is None:
                log.warning("SIGHUP: no --api-keys-file to reload; ignored")
                continue
            try:
                loaded = tenants.reload()
            except ValueError as exc:
                log.error("SIGHUP: keeping the keys in force: %s", exc)
                continue
            log.info(
                "SIGHUP: API keys of %d tenant(s) reloaded from %s", len(loaded), tenants.source
            )


async def close_connections(state: ServerState) -> None:
    """Wait (``state.shutdown`` being set) for open connections to close, at most
    ``limits.shutdown_timeout`` seconds; then abort the TCP connections of those still
    open and give their handlers a short, bounded while to end."""
    with trio.move_on_after(state.limits.shutdown_timeout):
        await state.idle.wait()
    if state.idle.is_set():
        return
    aborted = state.abort_connections()
    log.warning(
        "%d connection(s) still open %.1f s after shutdown began (a client that reads "
        "nothing); aborted %d TCP connection(s)",
        state.connections,
        state.limits.shutdown_timeout,
        aborted,
    )
    with trio.move_on_after(ABORT_GRACE_SECONDS):
        await state.idle.wait()


async def _stop_when_hung(state: ServerState, stop: trio.Event) -> None:
    """A model call that never returns cannot be cancelled (a Python thread cannot be
    killed): once the engine is declared hung, close the open connections and stop
    serving, so the process exits non-zero (``EXIT_ENGINE_HUNG``) for its supervisor
    to restart it."""

    async def on_hung(reason: str) -> None:
        # A bounded grace first, in which /health answers 503 with the reason and new
        # clients get inference_error at once (waiting ones already have).
        await trio.sleep(state.limits.shutdown_timeout)
        state.shutdown.set()
        await close_connections(state)
        stop.set()

    await watch_for_hung_calls(state.engine, state.limits.max_step_seconds, on_hung)


async def drain(state: ServerState, seconds: float) -> None:
    """Refuse new conversations and wait (at most ``seconds``) for open ones to end.

    Returns early when every connection has closed or ``state.shutdown`` is set.
    """
    state.draining.set()
    idle = state.idle  # no connection opens while draining, so this event stays current
    with trio.move_on_after(seconds) as deadline:
        async with trio.open_nursery() as nursery:

            async def until(event: trio.Event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(until, idle)
            nursery.start_soon(until, state.shutdown)
    if deadline.cancelled_caught:
        log.info("drain timeout of %.0f s reached; closing open connections (1001)", seconds)
    elif not state.shutdown.is_set():
        log.info("drained: no open connection")


async def _next_signal(signals: AsyncIterator[int]) -> int:
    async for signum in signals:
        return signum
    raise RuntimeError("the signal receiver ended")  # pragma: no cover


def serving_lines(binds: list[str], max_sessions: int = 1) -> list[str]:
    """What ``realtime serve`` prints once it listens: per bound address the native
    WebSocket (the ``realtime: serving`` line tools wait for), the OpenAI Realtime
    endpoint and the browser page."""
    lines = []
    for http in binds:
        ws = http.replace("http://", "ws://").replace("https://", "wss://")
        lines.append(f"realtime: serving {ws}{NATIVE_PATH}")
        lines.append(f"realtime: OpenAI Realtime endpoint {ws}{OPENAI_PATH}")
        lines.append(f"realtime: OpenAI Live endpoint {ws}{LIVE_PATH}")
        many = f" ({max_sessions} conversations at once)" if max_sessions > 1 else ""
        lines.append(f"realtime: browser page {http}/{many}")
    return lines


def _leaf(group: BaseExceptionGroup[OSError]) -> OSError:
    """The first error of a group ``except*`` matched (trio nests a group per nursery)."""
    inner: OSError | BaseExceptionGroup[OSError] = group
    while isinstance(inner, BaseExceptionGroup):
        inner = inner.exceptions[0]
    return inner


def _recording(args: argparse.Namespace, conversations: int = 1) -> Recording | None:
    """``--record DIR``, its folder made and checked writable now (exit 2 if not); each
    of ``conversations`` at once may write its share of ``--record-max-bytes``."""
    if not getattr(args, "record", None):
        return None
    directory = Path(args.record).expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".realtime-write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"cannot record to {directory}: {exc.strerror or exc}") from None
    share = share_of(args.record_max_bytes, conversations)
    log.info(
        "recording every call to %s (at most %d bytes, %d a conversation)",
        directory,
        args.record_max_bytes,
        share,
    )
    return Recording(directory, args.record_max_bytes, share)


def warm_prompts_from_args(paths: Sequence[str] | None, max_bytes: int) -> tuple[WarmPrompt, ...]:
    """``--warm-prompt`` files, else ``REALTIME_WARM_PROMPT``'s, each at most
    ``max_bytes``; a bad file exits 2, before the model loads."""
    try:
        if paths is None:
            return warm_prompts_from_env(os.environ, max_bytes)
        return read_warm_prompts(paths, max_bytes)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def tenants_from_args(args: argparse.Namespace) -> Tenants | None:
    """``--api-keys-file`` (read now: a bad file exits 2) or ``--api-key``; None: no key."""
    tenants = tenants_from(
        getattr(args, "api_keys_file", None),
        getattr(args, "api_key", None),
        share_prompt_cache=bool(getattr(args, "share_prompt_cache", False)),
    )
    if tenants is not None and tenants.source is not None:
        log.info(
            "API keys of %d tenant(s) from %s (SIGHUP reloads it)",
            len(tenants.names),
            tenants.source,
        )
    return tenants


def serve_command(args: argparse.Namespace, limits: Limits) -> int:
    tenants = tenants_from_args(args)  # a bad keys file exits 2 here
    # A bad path exits 2 here.
    loader = model_loader(args.model, args.quantize, demo_turns=args.demo_turns)
    warm = warm_prompts_from_args(getattr(args, "warm_prompt", None), limits.max_message_bytes)
    try:
        keeping = keeping_from(
            getattr(args, "state_cache_dir", None), getattr(args, "build_ahead", None), os.environ
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    config = hypercorn_config(args.host, args.port, limits)
    try:
        bind_now(config)  # a port in use exits 2 here, before the model loads
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        ) from None
    recording = _recording(args, limits.max_sessions)
    metrics = PrometheusObserver()
    observer = Observers((metrics, SessionLog()))
    try:
        engine = start_engine(
            loader,
            observer,
            limits,
            batch_frames=getattr(args, "batch_frames", None),
            warm=warm,
            keeping=keeping,
        )
    except BaseException:
        _close_bound(config)
        raise
    state = ServerState(
        engine=engine,
        limits=limits,
        tenants=tenants,
        allowed_origins=tuple(args.allowed_origin),
        bind_hosts=(args.host,),
        allowed_hosts=tuple(args.allowed_host),
        replica_id=getattr(args, "replica_id", None),
        metrics=metrics,
        observer=observer,
        recording=recording,
    )

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(run_server, state, config))
            for line in serving_lines(binds, limits.max_sessions):
                print(line, file=sys.stderr, flush=True)

    try:
        trio.run(main)
    except* OSError as group:
        os_error = _leaf(group)
        raise UsageError(
            f"cannot listen on {args.host}:{args.port}: {os_error.strerror or os_error}"
        ) from None
    finally:
        # The engine stops its queued work at shutdown (a tool feed or an opening ends
        # before its next step), so only the step under way is waited for, within the
        # shutdown's bound (drain + shutdown timeout + ABORT_GRACE_SECONDS).
        engine.shutdown(timeout=1.0 if engine.hung else ABORT_GRACE_SECONDS)
    if engine.hung:
        log.critical(
            "stopped: the engine is hung (%s); exiting %d", engine.dead_reason, EXIT_ENGINE_HUNG
        )
        exit_skipping_native_teardown(EXIT_ENGINE_HUNG)
    log.info("stopped")
    exit_skipping_native_teardown(0)
    return 0


def exit_skipping_native_teardown(code: int) -> None:
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
