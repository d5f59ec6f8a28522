"""A TCP proxy for the clients' resume tests: it forwards every connection to a server
and, on :meth:`CutProxy.cut`, ends the ones open now without a WebSocket close frame,
as a network drop does (both sides see the TCP connection end; the client reports
1006). :func:`proxy_thread` runs one for a synchronous test (the browser's)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial

import trio


class CutProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.connections = 0
        """Connections accepted so far."""
        self.cuts = 0
        self._open: set[trio.CancelScope] = set()
        self._silent = False
        self._held: list[trio.SocketStream] = []

    def cut(self, *, silent_upstream: bool = False) -> int:
        """End every connection open now (synchronous: callable from an event
        callback); how many were cut. With ``silent_upstream`` only the client's side
        is closed: the server's side stays open and silent until the proxy ends, as
        when a phone's network vanishes (nothing reaches the server or its balancer)."""
        self._silent = silent_upstream
        scopes = list(self._open)
        for scope in scopes:
            scope.cancel()
        self.cuts += 1
        return len(scopes)

    async def _pipe(self, source: trio.SocketStream, sink: trio.SocketStream) -> None:
        try:
            while data := await source.receive_some(65536):
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _serve(self, client: trio.SocketStream) -> None:
        self.connections += 1
        with trio.CancelScope() as scope:
            self._open.add(scope)
            try:
                server = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            except OSError:
                await client.aclose()
                return
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pipe, client, server)
                    nursery.start_soon(self._pipe, server, client)
            finally:
                self._open.discard(scope)
                with trio.CancelScope(shield=True):
                    await client.aclose()
                    if self._silent:
                        self._held.append(server)
                    else:
                        await server.aclose()
        self._open.discard(scope)


@asynccontextmanager
async def cut_proxy(target_port: int) -> AsyncIterator[CutProxy]:
    """A :class:`CutProxy` to ``127.0.0.1:target_port`` on a free port, for the block."""
    proxy = CutProxy(target_port)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, proxy._serve, 0, host="127.0.0.1"))
        proxy.port = listeners[0].socket.getsockname()[1]
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
            for stream in proxy._held:
                with trio.CancelScope(shield=True):
                    await stream.aclose()


@contextmanager
def proxy_thread(target_port: int) -> Iterator[tuple[CutProxy, trio.lowlevel.TrioToken]]:
    """A :func:`cut_proxy` in a thread of its own: the proxy, and the token to call
    its :meth:`CutProxy.cut` with (``trio.from_thread.run_sync(proxy.cut,
    trio_token=token)``)."""
    ready = threading.Event()
    stop: list[trio.Event] = []
    found: list[tuple[CutProxy, trio.lowlevel.TrioToken]] = []

    async def main() -> None:
        async with cut_proxy(target_port) as proxy:
            stop.append(trio.Event())
            found.append((proxy, trio.lowlevel.current_trio_token()))
            ready.set()
            await stop[0].wait()

    thread = threading.Thread(target=trio.run, args=(main,), daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError("the proxy did not start")
    proxy, token = found[0]
    try:
        yield proxy, token
    finally:
        trio.from_thread.run_sync(stop[0].set, trio_token=token)
        thread.join(10)
