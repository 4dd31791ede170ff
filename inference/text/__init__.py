"""Text in and out of the model: tokenization (pieces, ids, bytes; incremental UTF-8-safe
decoding), sandboxed chat templates, and the reasoning split of `<think>` blocks."""
