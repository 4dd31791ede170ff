"""What the engine core asks of a request in its batch, whatever kind it is.

Owns the contract `EngineCore` drives every request through: a sampled request
(`inference.requests.Request`) and a beam search (`inference.beams.BeamRequest`) both implement
it, so the core has no branch on a request's kind. Must not know: how either one samples or
searches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from inference.core.sequence import Sequence
    from inference.events import Finished
    from inference.requests import Request, Vocabulary
    from inference.sampling.sampler import Row
    from inference.sampling_params import SamplingParams
    from inference.vision.images import PromptImage
    from inference.vision.spans import ImageSpan


class BatchRequest(Protocol):
    request_id: int
    params: SamplingParams
    is_cancelled: bool
    prefill_started_at: float | None
    images: tuple[PromptImage, ...]  # their pixels, for every pass over their tokens
    image_spans: tuple[ImageSpan, ...]
    forks: list[Request]  # not started yet: they end with it

    @property
    def seqs(self) -> list[Sequence]:
        """The sequences it holds KV blocks for."""
        ...

    def sampling_rows(self) -> list[tuple[Request, Row]]:
        """The rows this step samples for it (the step samples every request's in one call)."""
        ...

    def take_logits(self, seq: Sequence, logits: torch.Tensor) -> bool:
        """`seq`'s raw logits row of this step; True when it can advance on the rows it has."""
        ...

    def kv_bytes(self, bytes_per_token: int, block_size: int) -> int:
        """The KV cache it keeps now."""
        ...

    def end(self, reason: str, vocab: Vocabulary, kv_bytes: int, error: str | None = None) -> Finished:
        """Its `Finished` record when it ends before its own end: `cancelled` or `error`."""
        ...
