"""One forward pass for a whole continuous-batching step of a Llama-family model.

Owns: turning a step's chunks (prefill chunks and decodes of many sequences) into one pass:
the projections and the MLP run over all new tokens at once (so each weight is read once per
step, whoever shares it), attention reads each sequence's keys and values from the paged
pool, and logits are computed only at the positions that sample. On the fused kernels every
row, decode or prompt, attends through one kernel over its own context's slots (a prompt
chunk's rows share its slots list, each reading up to its own position), so with the
batch-invariant matmuls a token's logits are the same whatever shares its step and however
its prefix was computed. On torch ops (and the fused kernels' fast mode) prefill chunks attend
one by one through torch's fused kernel, decodes padded together with a mask. The weights,
rotary tables and math are the lean runner's (`llama.LlamaRunner`).
Must not know: sampling, requests, the scheduler's policy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)

from inference.core.scheduler import Chunk
from inference.kernels.cpu import KVAddress
from inference.kv.paged import PagedKVPool
from inference.models.fused import Attend
from inference.models.llama import LlamaRunner, decode_attention, prompt_attention
from inference.models.quant import linear


@dataclass
class _Prefill:
    row: int  # first row of the chunk in the step's token rows
    num_tokens: int
    start: int  # position of its first token in the sequence
    context_slots: torch.Tensor  # (start + num_tokens,) slots of every position it attends to


@dataclass
class StepInput:
    input_ids: torch.Tensor  # (T,) every new token of the step
    positions: torch.Tensor  # (T,)
    slots: torch.Tensor  # (T,) where each new token's KV goes
    context_slots: torch.Tensor  # (sum of the chunks' ends,) each chunk's context slots, one after another
    context_starts: torch.Tensor  # (T,) where row t's context starts in context_slots (it reads positions + 1)
    decode_rows: torch.Tensor  # (B,) rows of single-token chunks
    decode_slots: torch.Tensor | None  # (B, max_context) their context's slots, padded (torch path); else None
    decode_lengths: torch.Tensor  # (B,) how many of those slots each reads
    decode_mask: torch.Tensor | None  # (B, 1, 1, max_context); None when no padding
    prefills: list[_Prefill]
    logit_rows: torch.Tensor  # (S,) rows whose logits are needed, in chunk order


class BatchedLlamaRunner:
    name = "lean-llama"

    def __init__(self, lean: LlamaRunner, pool: PagedKVPool) -> None:
        self.lean, self.pool = lean, pool
        self.device = lean.device

    def prepare(self, chunks: list[Chunk]) -> StepInput:
        """Host-side bookkeeping of a step (plain lists), moved to the device once."""
        ids, positions, slots, context_slots, prefills, logit_rows = [], [], [], [], [], []
        context_starts, decode_rows, decode_slots = [], [], []
        row = offset = 0
        for chunk in chunks:
            seq, end = chunk.seq, chunk.start + chunk.num_tokens
            ids += seq.token_ids[chunk.start : end]
            positions += range(chunk.start, end)
            context = self.pool.slot_ids(seq.block_table, 0, end)  # (end,)
            slots += context[chunk.start :]
            context_slots += context
            context_starts += [offset] * chunk.num_tokens
            offset += end
            if chunk.num_tokens == 1:
                decode_rows.append(row)
                decode_slots.append(context)
            else:
                prefills.append((row, chunk.num_tokens, chunk.start, context))
            logit_rows += [row + offset for offset in chunk.logit_offsets()]
            row += chunk.num_tokens
        to = self.device
        lengths = [len(s) for s in decode_slots]
        padded = mask = None
        if self.lean.fused is None and decode_slots:  # torch's attention reads the decodes padded together
            padded = torch.nn.utils.rnn.pad_sequence([torch.tensor(s) for s in decode_slots], batch_first=True).to(to)
            if min(lengths) != max(lengths):
                mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None])[:, None, None].to(to)

        def tensor(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=to)

        return StepInput(
            input_ids=tensor(ids),
            positions=tensor(positions),
            slots=tensor(slots),
            context_slots=tensor(context_slots),
            context_starts=tensor(context_starts),
            decode_rows=tensor(decode_rows),
            decode_slots=padded,
            decode_lengths=tensor(lengths),
            decode_mask=mask,
            prefills=[_Prefill(row, n, start, tensor(context)) for row, n, start, context in prefills],
            logit_rows=tensor(logit_rows),
        )

    @torch.inference_mode()
    def forward(self, step: StepInput, residuals: list[torch.Tensor] | None = None) -> torch.Tensor:
        """float32 logits (S, vocab) at `step.logit_rows`; writes every new token's KV to the pool.
        `residuals`, when given, receives the residual stream (S, hidden) at `step.logit_rows`
        after the embedding and after each layer."""
        lean = self.lean
        if lean.fused is not None:
            kv = KVAddress.layers(self.pool.buffer, slot_dim=2, head_dim=3)  # (layers, 2, slots, KVH, D)
            attend = self._attend(step, kv)
            return lean.fused.forward(
                step.input_ids, step.positions, step.slots, kv, attend, step.logit_rows, residuals
            )
        h = lean.embed(step.input_ids)  # (T, hidden)
        cos, sin = lean.cos[step.positions][:, None], lean.sin[step.positions][:, None]  # (T, 1, D)
        if residuals is not None:
            residuals.append(h[step.logit_rows])
        for i, layer in enumerate(lean.layers):
            x = lean.rms_norm(h, layer.input_norm)
            h = h + linear(self._attention(i, layer, x, cos, sin, step), layer.o_weight)
            x = lean.rms_norm(h, layer.post_norm)
            gate, up = linear(x, layer.gate_up_weight).split(lean.intermediate_size, dim=-1)
            h = h + linear(F.silu(gate) * up, layer.down_weight)
            if residuals is not None:
                residuals.append(h[step.logit_rows])
        return self.read_out(h[step.logit_rows])  # (S, vocab)

    def read_out(self, h: torch.Tensor) -> torch.Tensor:
        """The final norm and output layer on residual rows h (S, hidden) -> float32 (S, vocab)."""
        lean = self.lean
        if lean.fused is not None:
            return lean.fused.read_out(h)
        return linear(lean.rms_norm(h, lean.final_norm), lean.lm_head).float()

    def forward_layers(self, step: StepInput) -> torch.Tensor:
        """The logit lens of one pass: float32 (L + 1, S, vocab), the final norm and output layer
        on the residual stream after the embedding and after each layer; the last row is the
        pass's own logits."""
        residuals: list[torch.Tensor] = []
        logits = self.forward(step, residuals)
        return torch.stack([*(self.read_out(h) for h in residuals[:-1]), logits])

    def _attention(
        self, i: int, layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, step: StepInput
    ) -> torch.Tensor:
        lean, num_rows = self.lean, x.shape[0]
        q, k, v = lean.split_rotate(linear(x, layer.qkv_weight, layer.qkv_bias), cos, sin)  # (T, heads, D)
        self.pool.write(i, step.slots, k, v)
        if not step.prefills:  # decodes only (the common step): the rows are the decodes, in order
            return self._decode_attention(i, q, step).reshape(num_rows, lean.q_size)
        out = torch.empty(num_rows, lean.num_heads, lean.head_dim, dtype=x.dtype, device=x.device)
        if step.decode_slots is not None:
            out[step.decode_rows] = self._decode_attention(i, q[step.decode_rows], step)
        self._attend_prefills(i, q, out, step)
        return out.view(num_rows, lean.q_size)

    def _attend(self, step: StepInput, kv: list[KVAddress]) -> Attend:
        """The fused path's attention. Batch-invariant: every row on the kernel over its own
        context (prompt rows the same way as decodes). Fast mode: decode rows on the kernel,
        each prefill chunk on torch's fused kernel (float32) over its gathered context."""
        fused = self.lean.fused
        lengths = step.positions + 1
        if fused.is_batch_invariant or not step.prefills:
            return fused.attend(kv, lengths, step.context_slots, step.context_starts)
        rows = step.decode_rows
        decode = fused.attend(kv, lengths[rows], step.context_slots, step.context_starts[rows]) if len(rows) else None

        def attend(i: int, q: torch.Tensor, out: torch.Tensor) -> None:
            if decode is not None:
                decoded = torch.empty(len(rows), *out.shape[1:], dtype=out.dtype)
                decode(i, q[rows], decoded)
                out[rows] = decoded
            self._attend_prefills(i, q, out, step)

        return attend

    def _attend_prefills(self, i: int, q: torch.Tensor, out: torch.Tensor, step: StepInput) -> None:
        """Each prefill chunk's rows of out (T, H, D): its queries q (T, H, D) over its gathered
        context, in q's dtype (float32 from the kernels, else the pool's)."""
        for p in step.prefills:
            keys, values = (t.transpose(0, 1).to(q.dtype) for t in self.pool.gather(i, p.context_slots))  # (KVH, L, D)
            rows = slice(p.row, p.row + p.num_tokens)
            out[rows] = prompt_attention(q[rows], keys, values, p.start)

    def _decode_attention(self, i: int, q: torch.Tensor, step: StepInput) -> torch.Tensor:
        """q (B, H, D) of single-token chunks -> (B, H, D), each over its own context (padded, masked)."""
        keys, values = self.pool.gather(i, step.decode_slots)  # (B, L, KVH, D)
        return decode_attention(q, keys.transpose(1, 2), values.transpose(1, 2), step.decode_mask)
