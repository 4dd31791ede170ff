"""Picking the next token from logits: seeded random sampling or greedy argmax.

Owns: the per-request random generator (and so reproducibility: the same seed gives the same
tokens run after run on the same device, whatever else shares the step), the processed and raw
log-probabilities every step reports, sampling a whole step's rows in one call (`sample_rows`:
processors run once per group of rows with equal settings, one host read at the end), and
small read-outs of a distribution (top alternatives, entropy, rank).
Must not know: models, caches, tokenizers, events.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from inference.kernels import cpu as cpu_kernels
from inference.sampling.grammar import GrammarMatcher, apply_masks, removed_mass
from inference.sampling.logits import apply_processors, build_processors
from inference.sampling_params import MAX_SEED, SamplingParams


@dataclass(frozen=True)
class SampleOutput:
    token_ids: torch.Tensor  # (B,) int64
    logprobs: torch.Tensor  # (B, V) log-softmax of the processed logits: what was sampled from
    raw_logprobs: torch.Tensor  # (B, V) log-softmax of the model's raw logits


class Sampler:
    """Turns one step's logits into token ids under one request's `SamplingParams`.

    Owns a `torch.Generator` on `device`, seeded with `params.seed` or, when that is None, with
    a fresh random seed exposed as `.seed` so the run can be repeated (drawn within
    `MAX_SEED`, as a given one must be: the pages show it exactly).
    """

    def __init__(self, params: SamplingParams, device: torch.device | str):
        self.params = params
        self.processors = build_processors(params)
        self.seed = params.seed if params.seed is not None else secrets.randbelow(MAX_SEED + 1)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(self.seed)

    @property
    def settings_key(self) -> tuple:
        """Equal for samplers whose rows can be processed together."""
        return (tuple(self.processors), self.params.is_greedy)

    def __call__(self, logits: torch.Tensor, context_ids: torch.Tensor) -> SampleOutput:
        """`logits` (B, V) in any float dtype; `context_ids` (B, T) = prompt + generated so far."""
        logits = logits.float()
        raw_logprobs = torch.log_softmax(logits, dim=-1)
        processed = apply_processors(self.processors, logits, context_ids)
        logprobs = torch.log_softmax(processed, dim=-1) if self.processors else raw_logprobs
        if self.params.is_greedy:
            token_ids = argmax(processed)
        else:
            token_ids = _draw(logprobs.exp(), self.generator)
        _check_drawn(token_ids, logprobs)
        return SampleOutput(token_ids=token_ids, logprobs=logprobs, raw_logprobs=raw_logprobs)


def _check_drawn(token_ids: torch.Tensor, logprobs: torch.Tensor) -> None:
    """A clear error for a distribution with nothing to draw (NaN logits from the model, or every
    token filtered), instead of an index past the vocabulary further on. O(B): it reads the
    chosen tokens only (argmax picks a NaN; inverse-CDF sampling over NaN gives index V)."""
    vocab_size = logprobs.shape[-1]
    chosen = logprobs.gather(-1, token_ids.clamp(max=vocab_size - 1)[:, None])
    if bool((token_ids >= vocab_size).any()) or not bool(torch.isfinite(chosen).all()):
        raise ValueError("the sampling distribution is empty or not a number (NaN logits, or every token filtered)")


def _draw(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One token per row of `probs` (B, V) by inverse-CDF sampling: one uniform number per row,
    about 10x cheaper than `torch.multinomial` on a 49k vocabulary on CPU."""
    return _inverse_cdf(probs, _uniform(generator, probs.shape[0]).to(probs.device))


def _uniform(generator: torch.Generator, n: int) -> torch.Tensor:
    """(n, 1) float64 uniform numbers in [0, 1) from `generator`, on the generator's own device (a
    CUDA generator cannot fill a CPU tensor, nor a CPU one a CUDA tensor)."""
    return torch.rand(n, 1, generator=generator, dtype=torch.float64, device=generator.device)


def _inverse_cdf(probs: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """probs (B, V), uniform (B, 1) float64 in [0, 1) -> (B,) token ids."""
    # float64 so tokens with tiny probabilities keep their share of the cumulative sum.
    cdf = probs.double().cumsum(dim=-1)
    # 1 - U lies in (0, 1]: the first index whose cumulative mass reaches the target then
    # always has a positive probability, and the target never passes the total.
    target = (1 - uniform) * cdf[:, -1:]
    return torch.searchsorted(cdf, target).squeeze(-1)


# ---- a whole step's rows at once -------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One sampled row of a step: the request's sampler, its tokens so far (the repetition
    penalty reads them), a token forced on it (the thinking budget's `</think>`), and how many
    alternatives it reports."""

    sampler: Sampler
    context_ids: Sequence[int]
    forced_token_id: int | None = None
    num_alternatives: int = 0
    grammar: GrammarMatcher | None = None  # the request's grammar: it masks this row's distribution
    draft_token_id: int | None = None  # a proposed token this row verifies: its logprob is read out too

    @property
    def is_processed(self) -> bool:
        """Whether its sampled distribution may differ from the raw one."""
        return bool(self.sampler.processors) or self.grammar is not None


@dataclass(frozen=True)
class RowSample:
    """What one row drew and the read-outs of its distributions (plain numbers)."""

    token_id: int
    logprob: float  # of the processed distribution: what was sampled from
    raw_logprob: float
    rank: int  # 1-based, in the raw distribution (ties share the better rank)
    entropy: float  # of the raw distribution, nats
    top_raw: tuple[tuple[int, float], ...]  # (token id, logprob), most likely first
    top_processed: tuple[tuple[int, float], ...] | None  # None: no processor, same as top_raw
    error: str | None = None  # the settings left nothing to sample (the row's request fails alone)
    masked_prob: float | None = None  # the raw distribution's mass the grammar removed (None: no grammar)
    top_masked: tuple[tuple[int, float], ...] = ()  # the entries of `top_raw` the grammar removed
    draft_logprob: float | None = None  # of `Row.draft_token_id` in the processed distribution


def sample_rows(logits: torch.Tensor, rows: Sequence[Row]) -> list[RowSample]:
    """`logits` (S, V), one row per entry of `rows` -> one `RowSample` each. Each row's tokens and
    numbers are those its own `Sampler` gives it alone: rows only share the ops. A row with a
    grammar is masked first (its disallowed tokens -inf), then processed like any other: the raw
    distribution and its read-outs stay the model's own."""
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)  # (S, V)
    masked = apply_masks(logits, [r.grammar for r in rows])  # (S, V): `logits`, or a copy masked by the grammars
    masked_indices = [i for i, r in enumerate(rows) if r.grammar is not None]
    logprobs = raw_logprobs.clone() if any(r.is_processed for r in rows) else raw_logprobs
    masked_probs: list[float | None] = [None] * len(rows)
    if masked_indices:
        index_masked = torch.tensor(masked_indices, device=logits.device)
        masked_rows = masked[index_masked]  # (G, V)
        masked_logprobs = torch.log_softmax(masked_rows, dim=-1)
        logprobs[index_masked] = masked_logprobs
        removed = removed_mass(raw_logprobs[index_masked], masked_logprobs, argmax(masked_rows))
        for i, p in zip(masked_indices, removed.tolist()):
            masked_probs[i] = p
    token_ids = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    groups: dict[tuple, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault(row.sampler.settings_key, []).append(i)
    for indices in groups.values():
        first = rows[indices[0]].sampler
        # Every row in one group (the common step): the rows as they are, not a copy of them
        # (a 49k vocabulary's 8 rows: 0.26 ms).
        index = slice(None) if len(indices) == len(rows) else torch.tensor(indices, device=logits.device)
        processed = masked[index]
        if first.processors:
            processed = apply_processors(
                first.processors, processed, _contexts([rows[i] for i in indices], logits.device)
            )
            logprobs[index] = torch.log_softmax(processed, dim=-1)
        if first.params.is_greedy:
            token_ids[index] = argmax(processed)
        else:
            uniform = torch.cat([_uniform(rows[i].sampler.generator, 1) for i in indices]).to(logits.device)
            token_ids[index] = _inverse_cdf(logprobs[index].exp(), uniform)
    samples = _read_outs(logits, raw_logprobs, logprobs, token_ids, rows)
    for i, row in enumerate(rows):
        if row.draft_token_id is not None and samples[i].error is None:
            samples[i] = replace(samples[i], draft_logprob=float(logprobs[i, row.draft_token_id]))
    if not masked_indices:
        return samples
    for i in masked_indices:
        samples[i] = replace(
            samples[i], masked_prob=masked_probs[i], top_masked=_removed(masked[i], samples[i].top_raw)
        )
    return samples


def _removed(masked_row: torch.Tensor, top_raw: tuple[tuple[int, float], ...]) -> tuple[tuple[int, float], ...]:
    """The entries of a row's `top_raw` that its grammar removed (-inf in its masked logits (V,)):
    the most likely removed tokens among the listed ones, read at k ids (a top-k over the removed
    tokens of a 151k row would cost as much as the mask itself)."""
    if not top_raw:
        return ()
    ids = [token_id for token_id, _ in top_raw]
    is_removed = torch.isneginf(masked_row[torch.tensor(ids, device=masked_row.device)]).tolist()
    return tuple(alt for alt, removed in zip(top_raw, is_removed) if removed)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """(B,) each row's greedy choice of `logits` (B, V): on the logits, not the logprobs
    (subtracting the log-normalizer can round two distinct logits to one value and so change
    which index wins); on the CPU kernels where they can read them (torch's took 0.3 ms for 8
    rows of a 49k vocabulary), the same index."""
    kernels = _kernels_for(logits, 2)
    return kernels.argmax(logits) if kernels is not None else logits.argmax(dim=-1)


def _contexts(rows: Sequence[Row], device: torch.device) -> torch.Tensor:
    """(B, T) context ids on `device` (the logits' own: the repetition penalty gathers the logits
    at them), right-padded with one id past the vocabulary (the penalty drops that column)."""
    width = max(len(r.context_ids) for r in rows)
    pad = 1 << 40
    return torch.tensor([[*r.context_ids, *[pad] * (width - len(r.context_ids))] for r in rows], device=device)


def _read_outs(
    logits: torch.Tensor, raw_logprobs: torch.Tensor, logprobs: torch.Tensor, token_ids: torch.Tensor, rows
) -> list[RowSample]:
    """The chosen token (forced ones included), its logprobs, rank and entropy and the top
    alternatives of each row: on a CPU with the kernels in one call for the whole step (host
    memory: no transfer), elsewhere vectorized over the rows and read back to the host once."""
    forced = [(i, r.forced_token_id) for i, r in enumerate(rows) if r.forced_token_id is not None]
    if forced:
        token_ids = token_ids.clone()
        token_ids[[i for i, _ in forced]] = torch.tensor([t for _, t in forced], device=token_ids.device)
    k = min(max(r.num_alternatives for r in rows), logits.shape[-1])
    has_processors = any(r.is_processed for r in rows)
    kernels = _kernels_for(raw_logprobs, 2)
    if kernels is not None and _kernels_for(logprobs, 2) is not None:
        return _host_read_outs(kernels, raw_logprobs, logprobs if has_processors else None, token_ids, rows, k)
    return _device_read_outs(raw_logprobs, logprobs, token_ids, rows, k)


def _host_read_outs(
    kernels: cpu_kernels.CpuKernels,
    raw_logprobs: torch.Tensor,
    logprobs: torch.Tensor | None,
    token_ids: torch.Tensor,
    rows: Sequence[Row],
    k: int,
) -> list[RowSample]:
    """`_read_outs` with the CPU kernels; `logprobs` None: no row has a processor."""
    reads = kernels.read_outs(raw_logprobs, logprobs, token_ids.contiguous(), k)
    token_list, is_valid, chosen = token_ids.tolist(), reads.is_valid.tolist(), reads.chosen.tolist()
    ranks, entropies = reads.ranks.tolist(), reads.entropies.tolist()
    raw_ids, raw_values = reads.top_raw_ids.tolist(), reads.top_raw_values.tolist()
    if logprobs is not None:
        processed_ids, processed_values = reads.top_processed_ids.tolist(), reads.top_processed_values.tolist()
    samples = []
    for i, row in enumerate(rows):
        if not is_valid[i]:
            samples.append(_invalid(row))
            continue
        n = row.num_alternatives
        top_raw = _kept(raw_ids[i], raw_values[i], n)
        top_processed = _kept(processed_ids[i], processed_values[i], n) if row.is_processed else None
        samples.append(RowSample(token_list[i], *chosen[i], ranks[i], entropies[i], top_raw, top_processed))
    return samples


def _device_read_outs(
    raw_logprobs: torch.Tensor, logprobs: torch.Tensor, token_ids: torch.Tensor, rows: Sequence[Row], k: int
) -> list[RowSample]:
    """`_read_outs` vectorized over the rows, with one read back to the host."""
    is_valid = (token_ids >= 0) & (token_ids < raw_logprobs.shape[-1]) & torch.isfinite(logprobs).any(dim=-1)
    safe = torch.where(is_valid, token_ids, 0)[:, None]  # (S, 1)
    chosen_raw = raw_logprobs.gather(1, safe)  # (S, 1)
    columns = [token_ids[:, None].double(), is_valid[:, None].double(), logprobs.gather(1, safe).double()]
    columns += [chosen_raw.double(), (raw_logprobs > chosen_raw).sum(dim=-1, keepdim=True).double() + 1]
    columns += [entropy(raw_logprobs)[:, None].double()]
    columns += [t.double() for t in _top_rows(raw_logprobs, k)] + [t.double() for t in _top_rows(logprobs, k)]
    host = torch.cat(columns, dim=1).tolist()  # the step's one read from the device
    samples = []
    for i, row in enumerate(rows):
        token_id, valid, logprob, raw_logprob, rank, ent, *rest = host[i]
        if not valid:
            samples.append(_invalid(row))
            continue
        n = row.num_alternatives
        top_raw = _kept(rest[:k], rest[k : 2 * k], n)
        top_processed = _kept(rest[2 * k : 3 * k], rest[3 * k :], n) if row.is_processed else None
        samples.append(RowSample(int(token_id), logprob, raw_logprob, int(rank), ent, top_raw, top_processed))
    return samples


def _top_rows(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(S, k) ids and logprobs of each row's k most likely tokens."""
    values, ids = torch.topk(logprobs, min(k, logprobs.shape[-1]), dim=-1)
    return ids, values


def _kept(ids: list[float], values: list[float], n: int) -> tuple[tuple[int, float], ...]:
    """The first `n` (id, logprob) pairs that were not filtered out."""
    return tuple((int(i), v) for i, v in zip(ids[:n], values[:n]) if v > -math.inf)


def _invalid(row: Row) -> RowSample:
    params = row.sampler.params
    message = (
        "the sampling settings left no token to choose from "
        f"(temperature={params.temperature}, top_k={params.top_k}, top_p={params.top_p}, "
        f"min_p={params.min_p}, repetition_penalty={params.repetition_penalty})"
    )
    return RowSample(-1, float("nan"), float("nan"), 0, float("nan"), (), None, error=message)


# Every step reports these read-outs of a 49k-entry distribution; torch spends 25-80 us on each
# (a sort, several full passes), the fused CPU kernels one pass each.
def _kernels_for(logprobs: torch.Tensor, ndim: int) -> cpu_kernels.CpuKernels | None:
    """The kernels when they can read `logprobs` (an `ndim`-dim contiguous float32 CPU tensor)."""
    if logprobs.device.type != "cpu" or logprobs.dtype != torch.float32 or not logprobs.is_contiguous():
        return None
    return cpu_kernels.load() if logprobs.dim() == ndim else None


def top_alternatives(logprobs: torch.Tensor, k: int) -> tuple[list[int], list[float]]:
    """The `k` most likely token ids of one distribution (V,) and their logprobs, most likely
    first (ties in id order); filtered (-inf) tokens are left out, so fewer than `k` may come back."""
    k = min(k, logprobs.shape[-1])
    if k <= 0:
        return [], []
    kernels = _kernels_for(logprobs, 1)
    values, ids = kernels.top_k(logprobs, k) if kernels else torch.topk(logprobs, k)
    is_kept = values > -torch.inf
    return ids[is_kept].tolist(), values[is_kept].tolist()


def entropy(logprobs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last dim ((B, V) -> (B,)); -inf entries contribute 0."""
    kernels = _kernels_for(logprobs, 2)
    if kernels is not None:
        return torch.tensor([kernels.entropy(row) for row in logprobs])
    terms = logprobs.exp() * logprobs
    return -torch.where(torch.isneginf(logprobs), 0.0, terms).sum(dim=-1)


def token_rank(logprobs: torch.Tensor, token_id: int) -> int:
    """1-based rank of `token_id` in one distribution (V,); tied tokens share the better rank."""
    kernels = _kernels_for(logprobs, 1)
    if kernels is not None:
        return kernels.count_greater(logprobs, float(logprobs[token_id])) + 1
    return int((logprobs > logprobs[token_id]).sum().item()) + 1
