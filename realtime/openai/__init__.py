"""The OpenAI Realtime (GA) dialect, served at ``/openai/v1/realtime``.

Pure rules, one concern a module: :mod:`.messages` (typed client messages),
:mod:`.session` (``session.update``), :mod:`.items` (the item store), :mod:`.tools`
(the tool prompt and calls), :mod:`.clock` (frame pacing, deadlines), :mod:`.turns`
(turns from the model's channels), :mod:`.responses` (the active response),
:mod:`.render` (event sequences), :mod:`.states` (phases and their transitions) and
:mod:`.dialect`, the thin state machine over them; :mod:`.events` builds and parses
GA events and :mod:`.audio` holds the streaming resamplers. :mod:`.connection` puts
the dialect on the one model pipeline (:mod:`realtime.session.pipeline`) the native
``/v1/realtime`` protocol uses too.
"""
