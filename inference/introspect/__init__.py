"""Seeing inside a finished generation: its logits recomputed, the sampler stage by stage,
what other settings would have sampled, the layers (logit lens, embedding, attention), the
KV cache's shape. Plain torch; must not know Django, Celery or sockets."""
