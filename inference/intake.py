"""Requests in: what one `add` of the engine becomes in the batch.

Owns: building the requests of one call: a sampled request and its forks (parallel choices
sharing one prefill, seeded seed, seed + 1, ...: they differ and replay), a beam search, or the
request a prefill worker's handoff resumes. Must not know: the scheduler, the KV pool, models.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as Seq

import torch

from inference.batch_request import BatchRequest
from inference.beams import BeamRequest
from inference.kv.transfer import Handoff
from inference.requests import Request, Vocabulary
from inference.sampling_params import MAX_SEED, SamplingParams
from inference.vision.images import PromptImage
from inference.vision.spans import ImageSpan


class Intake:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._ids: Iterator[int] = iter(range(1 << 62))

    def requests(
        self,
        vocab: Vocabulary,
        prompt_ids: list[int],
        params: SamplingParams,
        images: Seq[PromptImage],
        image_spans: Seq[ImageSpan],
        prefill_only: bool,
        num_choices: int,
        client: str,
    ) -> BatchRequest:
        """The request an `add` queues; a sampled one carries its not yet started forks."""
        if prefill_only and num_choices > 1:
            raise ValueError("a prefill-only request has one choice")
        if params.is_beam_search:
            request = BeamRequest.new(next(self._ids), prompt_ids, params, vocab, self.device)
            request.seq.client = client
            return request
        seeds = choice_seeds(params, num_choices)
        leader = self._request(vocab, prompt_ids, params, seeds[0], images, image_spans)
        leader.prefill_only = prefill_only
        leader.seq.num_slots = num_choices
        leader.forks = [self._request(vocab, prompt_ids, params, seed, images, image_spans) for seed in seeds[1:]]
        for request in (leader, *leader.forks):
            request.seq.client = client
        return leader

    def resumed(self, vocab: Vocabulary, handoff: Handoff, client: str) -> Request:
        """A request another worker prefilled, with its first token; its prompt's KV is loaded
        into its own blocks when it is admitted (none is recomputed)."""
        request = self._request(vocab, handoff.prompt_ids, handoff.params, handoff.seed, (), handoff.image_spans)
        request.resume(handoff, vocab)
        request.seq.num_imported_tokens = len(handoff.prompt_ids)
        request.seq.client = client
        return request

    def _request(self, vocab, prompt_ids, params, seed, images, image_spans) -> Request:
        args = (next(self._ids), prompt_ids, params, vocab, self.device)
        return Request.new(*args, seed=seed, images=images, image_spans=image_spans)


def choice_seeds(params: SamplingParams, num_choices: int) -> list[int | None]:
    """Each choice's seed: a seeded request's choices are seed, seed + 1, ... (so they differ and
    replay); an unseeded one's are drawn per choice."""
    if num_choices < 1:
        raise ValueError(f"num_choices={num_choices} must be >= 1")
    if params.seed is None:
        return [None] * num_choices
    return [(params.seed + i) % (MAX_SEED + 1) for i in range(num_choices)]
