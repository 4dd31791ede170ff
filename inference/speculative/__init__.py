"""Speculative decoding: cheap proposals of the next tokens, verified in one pass of the model
(docs/speculative-decoding.md)."""
