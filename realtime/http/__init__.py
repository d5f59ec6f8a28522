"""The HTTP face: the ASGI and Quart-trio app, and the guard over every TCP connection."""
