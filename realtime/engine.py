"""The engine: one long-lived thread that owns the model and runs every model call.

MLX ties streams to the thread that created them, and trio's worker threads do
not keep their identity, so the model is loaded on, and only ever touched by,
the single thread started here. The async side submits commands and is woken
through ``TrioToken.run_sync_soon`` when the reply is ready; it never runs
model code and never parks a trio worker thread while the model computes.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

import attrs
import trio

from realtime.models.base import (
    InferenceError,
    ModelEvent,
    ModelSession,
    RealtimeModel,
    Samples,
    SessionInitializationError,
)
from realtime.protocol import ErrorCode

log = logging.getLogger("realtime.engine")

T = TypeVar("T")


class EngineError(Exception):
    """A command failed; ``code`` is the wire error code to report."""

    def __init__(self, code: ErrorCode, message: str, *, session_dropped: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.session_dropped = session_dropped
        """True when the session is gone (the connection cannot go on with it)."""


class EngineDeadError(EngineError):
    """The engine thread has stopped; every call fails fast with this."""

    def __init__(self, reason: str) -> None:
        super().__init__(
            "inference_error", f"the model engine has stopped: {reason}", session_dropped=True
        )


class EngineLoadError(Exception):
    """The loader failed; the message is the model's own."""


@attrs.define(slots=True)
class _Command:
    kind: str
    session_id: str
    args: tuple[Any, ...]
    future: concurrent.futures.Future[Any]


@attrs.define(slots=True)
class _Active:
    session_id: str
    session: ModelSession
    finished: bool = False
    """Flushed or cancelled: closing must not cancel it again."""


_STOP: Final = object()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Engine:
    """Owns the model thread and the single-session reservation."""

    def __init__(
        self, loader: Callable[[], RealtimeModel], *, name: str = "realtime-engine"
    ) -> None:
        self._loader = loader
        self._queue: queue.SimpleQueue[_Command | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._loaded: concurrent.futures.Future[RealtimeModel] = concurrent.futures.Future()
        self._state_lock = threading.Lock()
        self._dead_reason: str | None = None
        self._reserved: str | None = None
        self._model: RealtimeModel | None = None
        self._active: _Active | None = None  # engine thread only

    # --- lifecycle ----------------------------------------------------------

    def start(self) -> RealtimeModel:
        """Start the thread, load the model on it, and block until it is ready."""
        self._thread.start()
        try:
            return self._loaded.result()
        except BaseException as exc:
            self._thread.join()
            raise EngineLoadError(str(exc) or type(exc).__name__) from exc

    def shutdown(self, timeout: float | None = 10.0) -> None:
        """Stop after the queued commands (an open session is cancelled) and join."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("engine thread still busy after %.1f s; leaving it", timeout or 0)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive() and self._dead_reason is None

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    @property
    def thread_ident(self) -> int | None:
        return self._thread.ident

    @property
    def loaded_model(self) -> RealtimeModel | None:
        return self._model

    @property
    def model(self) -> RealtimeModel:
        if self._model is None:
            raise RuntimeError("the engine has not loaded a model")
        return self._model

    # --- reservation --------------------------------------------------------

    def try_reserve(self, session_id: str) -> bool:
        with self._state_lock:
            if self._reserved is None:
                self._reserved = session_id
                return True
            return False

    def release(self, session_id: str) -> None:
        """Free the slot if ``session_id`` holds it; a release by another id is a no-op."""
        with self._state_lock:
            if self._reserved == session_id:
                self._reserved = None

    def is_reserved(self) -> bool:
        return self._reserved is not None

    @property
    def reserved_by(self) -> str | None:
        return self._reserved

    # --- commands -----------------------------------------------------------

    def submit(self, kind: str, session_id: str, *args: Any) -> concurrent.futures.Future[Any]:
        """Queue a command for the engine thread; the future holds its reply."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        with self._state_lock:
            if self._dead_reason is not None or not self._thread.is_alive():
                future.set_exception(EngineDeadError(self._dead_reason or "not running"))
            else:
                self._queue.put(_Command(kind, session_id, args, future))
        return future

    async def _call(self, kind: str, session_id: str, *args: Any) -> Any:
        return await self.wait(self.submit(kind, session_id, *args))

    async def wait(self, future: concurrent.futures.Future[T]) -> T:
        """Await a submitted command's reply without parking a thread."""
        if not future.done():
            token = trio.lowlevel.current_trio_token()
            ready = trio.Event()

            def wake(_: object) -> None:
                try:
                    token.run_sync_soon(ready.set)
                except trio.RunFinishedError:
                    pass

            future.add_done_callback(wake)
            await ready.wait()
        else:
            await trio.lowlevel.checkpoint()
        return future.result()

    async def open(
        self,
        session_id: str,
        *,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
    ) -> None:
        await self._call("open", session_id, system_prompt, seed, max_streaming_seconds)

    async def push(self, session_id: str, samples: Samples, sample_rate: int) -> list[ModelEvent]:
        result: list[ModelEvent] = await self._call("push", session_id, samples, sample_rate)
        return result

    async def flush(self, session_id: str, pad_partial: bool) -> list[ModelEvent]:
        result: list[ModelEvent] = await self._call("flush", session_id, pad_partial)
        return result

    async def cancel(self, session_id: str) -> list[ModelEvent]:
        result: list[ModelEvent] = await self._call("cancel", session_id)
        return result

    async def close(self, session_id: str) -> None:
        await self._call("close", session_id)

    def call(self, kind: str, session_id: str, *args: Any, timeout: float | None = None) -> Any:
        """Blocking form of a command, for code that is not in trio (tests, tools)."""
        return self.submit(kind, session_id, *args).result(timeout)

    def run_on_thread(self, fn: Callable[[RealtimeModel], T], *, timeout: float | None = None) -> T:
        """Run ``fn(model)`` on the engine thread (tools and checks that drive the
        model directly must still keep MLX on its one thread)."""
        result: T = self.call("run", "", fn, timeout=timeout)
        return result

    # --- the engine thread ----------------------------------------------------

    def _run(self) -> None:
        started = time.perf_counter()
        try:
            self._model = self._loader()
        except BaseException as exc:
            self._die(f"model failed to load: {_describe(exc)}")
            self._loaded.set_exception(exc)
            return
        log.info(
            "model %s ready on thread %s in %.2f s",
            self._model.model_id,
            threading.current_thread().name,
            time.perf_counter() - started,
        )
        self._loaded.set_result(self._model)
        command: _Command | None = None
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    break
                assert isinstance(item, _Command)
                command = item
                if command.future.set_running_or_notify_cancel():
                    self._execute(command)
                command = None
            self._die("shut down")
        except BaseException as exc:
            reason = f"engine thread died: {_describe(exc)}"
            log.critical(reason, exc_info=True)
            self._die(reason)
            if command is not None and not command.future.done():
                command.future.set_exception(EngineDeadError(reason))
        finally:
            self._drop_active(clear=True)

    def _die(self, reason: str) -> None:
        """Mark the engine dead and fail every queued command, under the submit lock."""
        with self._state_lock:
            if self._dead_reason is None:
                self._dead_reason = reason
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if isinstance(item, _Command) and item.future.set_running_or_notify_cancel():
                    item.future.set_exception(EngineDeadError(self._dead_reason))

    def _execute(self, command: _Command) -> None:
        try:
            result = getattr(self, f"_do_{command.kind}")(command.session_id, *command.args)
        except EngineError as exc:
            command.future.set_exception(exc)
        except InferenceError as exc:
            # The model reports a condition it survives (context limit, bad rate).
            command.future.set_exception(EngineError("inference_error", str(exc)))
        except Exception as exc:
            log.exception(
                "%s failed for %s; dropping the session", command.kind, command.session_id
            )
            self._drop_active(clear=True)
            code: ErrorCode = (
                "session_initialization_failed" if command.kind == "open" else "inference_error"
            )
            command.future.set_exception(EngineError(code, _describe(exc), session_dropped=True))
        else:
            command.future.set_result(result)

    def _session(self, session_id: str) -> _Active:
        active = self._active
        if active is None or active.session_id != session_id:
            raise EngineError(
                "inference_error", f"no open session {session_id}", session_dropped=True
            )
        return active

    def _do_open(
        self,
        session_id: str,
        system_prompt: str | None,
        seed: int,
        max_streaming_seconds: float | None,
    ) -> None:
        if self._active is not None:
            raise EngineError(
                "session_initialization_failed",
                f"session {self._active.session_id} is still open on the engine",
            )
        try:
            session = self.model.open_session(
                system_prompt=system_prompt,
                seed=seed,
                max_streaming_seconds=max_streaming_seconds,
            )
        except SessionInitializationError as exc:
            self.model.clear_cache()
            raise EngineError("session_initialization_failed", str(exc)) from exc
        self._active = _Active(session_id, session)

    def _do_push(
        self,
        session_id: str,
        samples: Samples,
        sample_rate: int,
        skip: threading.Event | None = None,
    ) -> list[ModelEvent] | None:
        """Run one slice; ``None`` when ``skip`` was set while the slice waited in the
        queue (a cancel or disconnect arrived: queued audio must not run)."""
        if skip is not None and skip.is_set():
            return None
        active = self._session(session_id)
        if active.finished:
            raise EngineError("inference_error", f"session {session_id} has ended")
        return active.session.push_audio(samples, sample_rate)

    def _do_flush(self, session_id: str, pad_partial: bool) -> list[ModelEvent]:
        active = self._session(session_id)
        events = active.session.flush(pad_partial)
        active.finished = True
        return events

    def _do_cancel(self, session_id: str) -> list[ModelEvent]:
        active = self._session(session_id)
        events = active.session.cancel()
        active.finished = True
        return events

    def _do_run(self, _: str, fn: Callable[[RealtimeModel], Any]) -> Any:
        return fn(self.model)

    def _do_close(self, session_id: str) -> None:
        if self._active is not None and self._active.session_id == session_id:
            self._drop_active(clear=True)

    def _drop_active(self, *, clear: bool) -> None:
        active, self._active = self._active, None
        if active is not None and not active.finished:
            try:
                active.session.cancel()
            except Exception:
                log.exception("cancelling session %s on close failed", active.session_id)
        if clear and self._model is not None:
            try:
                self._model.clear_cache()
            except Exception:
                log.exception("clearing the model's buffer cache failed")
