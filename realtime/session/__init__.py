"""One session's pipeline: a dialect's rules driven over a transport and the engine."""
