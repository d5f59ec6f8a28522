"""The OpenAI Realtime (GA) dialect, served at ``/openai/v1/realtime``.

:mod:`.audio` holds the streaming resamplers (24 kHz in, 24 kHz out),
:mod:`.events` builds and parses GA events, :mod:`.dialect` is the pure state
machine that maps the model's continuous frames onto turn-based responses,
and :mod:`.connection` is the trio plumbing between a socket, that state
machine and the engine. The native ``/v1/realtime`` protocol is untouched.
"""
