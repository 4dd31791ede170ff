"""Redis-backed coordination between web and worker processes: every Redis key name (`keys`),
the client (`store`), cancel flags, liveness heartbeats, cache-aware routing and the KV blob
store of the prefill/decode handoff. Imported by both sides; never imports torch."""
