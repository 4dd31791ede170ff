"""Code that runs in the ASGI (web) process: the WebSocket consumer, the HTTP API, the pages,
the submit bookkeeping. Never imports torch or `inference.models` (tests enforce it)."""
