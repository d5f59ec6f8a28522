"""The engine: one thread for all MLX work, split along its thread line (``facade``: what
the event loop calls; ``thread``: what the engine thread runs; ``commands``: what goes
between them; ``line``: the one locked state both see; ``capacity``: the slots), and the
pure rules it shares the thread by (``scheduler``, ``admission``, ``fairshare``)."""
