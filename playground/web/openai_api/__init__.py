"""The OpenAI-compatible HTTP API under `/v1/` (docs/openai-api.md): models, chat completions
and legacy completions, streaming or not, with logprobs.

Runs in the ASGI process: a request becomes a `Generation` row through `web.submit`, is
queued with `dispatch.enqueue` and followed over the channel layer like the WebSocket does.
Must not import torch or `playground.worker`.
"""
