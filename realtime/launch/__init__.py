"""The command roots: what starts a process (``realtime`` and its subcommands, the ASGI
app Hypercorn's own command loads) and what only a start does (bind the port, start the
engine, read warm prompts, run a file offline); the rest of the package is what they
share."""
