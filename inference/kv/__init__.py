"""The KV cache: its layouts and size (`cache`), reuse across requests (`prefix_cache`) and the
wire format that carries a prefilled cache to another worker (`transfer`). Must not know:
sampling, Django."""
