"""Everything that owns the device: loading weights (HF folder, hub cache, GGUF, the bundled
model) and the forward passes (`llama`: the lean Llama-family runner, `hf`: any transformers
causal LM). Must not know: requests, sampling, Django."""
