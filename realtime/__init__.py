"""A full-duplex speech model behind one WebSocket, ``/v1/realtime``, on trio."""

__version__ = "0.1.0"
