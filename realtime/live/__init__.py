"""OpenAI's Live API (GPT-Live) at ``/openai/v1/live/sessions``: the full-duplex dialect.

The model starts and ends its own turns; its speech goes out frame by frame, its
transcripts on the session's timeline, and work it hands off reaches the application as
delegations. :mod:`.messages` reads client events, :mod:`.config` the session
configuration, :mod:`.prompt` renders what VoiceChat is opened with, :mod:`.events`
spells server events, :mod:`.rules` is the state machine (no I/O) and
:mod:`.connection` runs it on the one session pipeline.
"""
