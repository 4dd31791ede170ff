"""Code that runs in the Celery worker: the loaded engine, one generation end to end, the
prefill/decode pair and the publisher that streams steps to the channel layer. Never touches
a socket or imports the consumers (tests enforce it)."""
