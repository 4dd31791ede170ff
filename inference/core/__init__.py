"""Tensor-free bookkeeping of continuous batching (nano-vllm's split): per-request state
(`sequence`), KV blocks with prefix hashes (`block_manager`) and what runs in each step
(`scheduler`). Plain Python, unit-tested without a device. Must not import torch."""
