"""From logits to a token: processors in one documented order (`logits`), the seeded sampler
(`sampler`), stop strings (`stopping`) and beam search (`beam`). Must not know: Django."""
