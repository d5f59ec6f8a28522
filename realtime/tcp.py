"""Abort a TCP connection that the ASGI server owns, found by its two addresses.

Hypercorn shields every socket write (``TCPServer.protocol_send``), so a task
blocked writing to a client that reads nothing cannot be cancelled, and a
graceful close queues behind that write. What does end the write is the socket
itself failing: :func:`abort_connection` finds the connection's descriptor by its
local and peer addresses (the ASGI scope's ``server`` and ``client``), sets
``SO_LINGER`` to zero and shuts it down in both directions. The blocked write then
fails at once (trio raises ``BrokenResourceError``, which Hypercorn handles as the
peer closing), Hypercorn closes the descriptor, and the zero linger turns that
close into a reset, so the kernel drops the unsent data instead of holding the
connection open until the peer reads.

The descriptor is only borrowed here (never closed): Hypercorn and trio own it.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator, Sequence
from typing import Any, Final

FD_DIRS: Final = ("/dev/fd", "/proc/self/fd")
"""Where a process lists its own descriptors (macOS and Linux both have /dev/fd)."""

Address = Sequence[Any]
"""An ASGI ``client`` / ``server`` entry: ``(host, port)``."""


def _descriptors() -> Iterator[int]:
    for folder in FD_DIRS:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if name.isdigit():
                yield int(name)
        return


def _same(address: Any, wanted: Address) -> bool:
    return (
        isinstance(address, tuple)
        and len(address) >= 2
        and str(address[0]) == str(wanted[0])
        and int(address[1]) == int(wanted[1])
    )


def abort_connection(local: Address | None, peer: Address | None) -> bool:
    """Reset the TCP connection from ``local`` to ``peer``; whether it was found.

    Safe to call for a connection that is already gone (returns False).
    """
    if not local or not peer or len(local) < 2 or len(peer) < 2:
        return False
    for fd in _descriptors():
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # not a socket, or closed meanwhile
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                continue
            try:
                if not (_same(sock.getpeername(), peer) and _same(sock.getsockname(), local)):
                    continue
            except OSError:
                continue  # a listening or unconnected socket
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already reset by the peer: Hypercorn sees it as closed anyway
            return True
        finally:
            sock.detach()  # borrowed: Hypercorn owns and closes the descriptor
    return False
