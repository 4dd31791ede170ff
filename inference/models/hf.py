"""One forward pass for a whole continuous-batching step of any transformers causal LM.

Owns: running a step's chunks (prefill chunks and decodes of many sequences) through the
model's own modules as ONE packed sequence (1, T): embeddings, projections, norms, MLPs and MoE
experts see every new token of the step at once, each with its own position id. Attention is
ours: a cache object handed to the model as `past_key_values` writes each layer's new keys
and values into the paged pool, and an attention function registered with transformers reads
each sequence's context back from it, masked causally per sequence (and by the layer's sliding
window: Gemma-3's local layers). What the model caches is what we store: heads of keys and
values, or DeepSeek's latent (MLA: the compressed kv and the shared rotary key, expanded by
the model after the read). Vision-language models take the step's images' pixels.
Must not know: sampling, requests, the scheduler's policy.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (torch's own convention)
from transformers import AttentionInterface, DynamicCache

from inference.core.scheduler import Chunk
from inference.kv.paged import PagedKVPool
from inference.models.matmul import route_linears

PAGED_ATTENTION = "playground_paged"
_ACTIVE: contextvars.ContextVar[StepKV | None] = contextvars.ContextVar("paged_step", default=None)


@dataclass
class StepLayout:
    """Where a step's tokens are: rows of the packed input, and each chunk's context."""

    input_ids: torch.Tensor  # (1, T)
    positions: torch.Tensor  # (1, T)
    slots: torch.Tensor  # (T,) where each new token's KV goes
    context_slots: torch.Tensor  # (C, max_context) each chunk's context, padded with slot 0
    context_lengths: list[int]  # (C,)
    rows: list[tuple[int, int]]  # (first row, num_tokens) of each chunk
    decode_chunks: torch.Tensor  # (D,) chunks of one token
    decode_rows: torch.Tensor  # (D,) their rows
    decode_mask: torch.Tensor  # (D, max_context) True where a key may be read
    logit_rows: torch.Tensor  # (S,) rows whose logits are needed, in chunk order


class StepKV:
    """`past_key_values` for one step: transformers' cache protocol over the paged pool.
    `update` stores the step's new keys/values and returns every chunk's context,
    (chunks, heads, max_context, dim), for the attention function (padding masked there)."""

    is_compileable = False

    def __init__(self, pool: PagedKVPool, layout: StepLayout) -> None:
        self.pool, self.layout = pool, layout

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        pool, layout = self.pool, self.layout
        keys = key_states[0].transpose(0, 1).to(pool.dtype)  # (T, heads, dim)
        pool.write(layer_idx, layout.slots, keys, value_states[0].transpose(0, 1).to(pool.dtype))
        context_keys, context_values = pool.gather(layer_idx, layout.context_slots)  # (C, L, heads, dim)
        dtype = key_states.dtype
        return context_keys.transpose(1, 2).to(dtype), context_values.transpose(1, 2).to(dtype)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions come as position_ids; nothing may be derived from a cache length


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float | None, softcap: float | None
) -> torch.Tensor:
    """q (B, H, Tq, D), k (B, KVH, L, D), v (B, KVH, L, Dv), mask (B, 1, Tq, L) -> (B, H, Tq, Dv).
    Float32 on a CPU (torch's bfloat16 attention kernel is several times slower there)."""
    dtype = q.dtype
    if q.device.type == "cpu":
        q, k, v = q.float(), k.float(), v.float()
    if softcap is None:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
        return out.to(dtype)
    if q.shape[1] != k.shape[1]:  # grouped-query attention, written out
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap  # Gemma-2's logit soft-capping
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).to(dtype)


def _window_mask(key_pos: torch.Tensor, query_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """(Tq, L): a query sees keys at or before it, within `window` positions when set."""
    mask = key_pos[None, :] <= query_pos[:, None]
    if window:
        mask &= key_pos[None, :] > query_pos[:, None] - window
    return mask


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function protocol: query (1, H, T, D) of the packed step; key and
    value as `StepKV.update` returned them. -> (1, T, H, Dv), no weights."""
    step = _ACTIVE.get()
    if step is None:
        raise RuntimeError("paged attention runs inside HFBatchedRunner.forward only")
    if kwargs.get("s_aux") is not None:
        raise ValueError("attention sinks are not supported by the batched runner")
    layout, device = step.layout, query.device
    num_heads, num_rows = query.shape[1], query.shape[2]
    out = query.new_empty(1, num_heads, num_rows, value.shape[-1])
    window = sliding_window or getattr(module, "sliding_window", None)
    lengths = layout.context_lengths
    if len(layout.decode_chunks):
        mask = layout.decode_mask
        if window:
            last = torch.tensor([lengths[c] - 1 for c in layout.decode_chunks.tolist()], device=device)
            key_pos = torch.arange(mask.shape[1], device=device)
            mask = mask & (key_pos[None, :] > last[:, None] - window)
        chunks = layout.decode_chunks
        q = query[0, :, layout.decode_rows].transpose(0, 1)[:, :, None]  # (D, H, 1, Dq)
        attended = _attend(q, key[chunks], value[chunks], mask[:, None, None], scaling, softcap)  # (D, H, 1, Dv)
        out[0, :, layout.decode_rows] = attended[:, :, 0].transpose(0, 1)
    for c, (row, num_tokens) in enumerate(layout.rows):
        if num_tokens == 1:
            continue
        length = lengths[c]
        key_pos = torch.arange(length, device=device)
        mask = _window_mask(key_pos, key_pos[length - num_tokens :], window)  # (n, L)
        q = query[:, :, row : row + num_tokens]  # (1, H, n, Dq)
        k, v = key[c : c + 1, :, :length], value[c : c + 1, :, :length]
        out[:, :, row : row + num_tokens] = _attend(q, k, v, mask[None, None], scaling, softcap)
    return out.transpose(1, 2), None


AttentionInterface.register(PAGED_ATTENTION, paged_attention)


@dataclass(frozen=True)
class KVGeometry:
    """What one token's cache entry is, per layer, as the model hands it to its cache."""

    num_layers: int
    key_shape: tuple[int, int]  # (heads, dim)
    value_shape: tuple[int, int]
    dtype: torch.dtype


def final_norm(model) -> torch.nn.Module:
    """The norm the model applies before its LM head (Llama/Qwen2/Mistral/Gemma/DeepSeek:
    `model.norm`, GPT-2: `transformer.ln_f`)."""
    decoder = model.get_decoder()
    for name in ("norm", "ln_f", "final_layer_norm"):
        if isinstance(getattr(decoder, name, None), torch.nn.Module):
            return getattr(decoder, name)
    raise ValueError(f"no final norm found on {type(model).__name__}: the logit lens needs one")


class HFBatchedRunner:
    name = "transformers"

    def __init__(self, model, kernel_matmuls: bool = True) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.text_config = model.config.get_text_config()
        # The model's linear layers on the fused kernels' matmul (CPU): a weight is read once per
        # step for all its rows. The fast mode (`batch_invariant=False`) keeps torch's.
        self.num_kernel_linears = route_linears(model) if kernel_matmuls else 0
        self.geometry = self._probe()

    def _language_attention(self) -> Callable[[], None]:
        """Routes the language model's attention to `paged_attention`; returns the undo. Set on the
        text config only: a vision tower keeps its own attention."""
        config = self.text_config
        before = config._attn_implementation_internal
        config._attn_implementation_internal = PAGED_ATTENTION

        def restore() -> None:
            config._attn_implementation_internal = before

        return restore

    @torch.inference_mode()
    def _probe(self) -> KVGeometry:
        """One token through the model, to see what each layer caches (the pool's geometry)."""
        cache = DynamicCache(config=self.model.config)
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        layers = [(layer.keys, layer.values) for layer in cache.layers if getattr(layer, "keys", None) is not None]
        if not layers:
            raise ValueError(f"{type(self.model).__name__} wrote nothing to its cache: it cannot run batched")
        # (1, heads, T, dim) -> (heads, dim)
        shapes = {(tuple(k.shape[1::2]), tuple(v.shape[1::2]), k.dtype) for k, v in layers}
        if len(shapes) != 1:
            raise ValueError(f"{type(self.model).__name__} caches differently shaped layers: {sorted(shapes)}")
        key_shape, value_shape, dtype = shapes.pop()
        return KVGeometry(len(layers), key_shape, value_shape, dtype)

    def new_pool(self, num_blocks: int, block_size: int) -> PagedKVPool:
        g = self.geometry
        return PagedKVPool(
            g.num_layers, num_blocks, block_size, *g.key_shape, g.dtype, self.device, value_shape=g.value_shape
        )

    def prepare(self, chunks: list[Chunk], pool: PagedKVPool) -> StepLayout:
        """Host-side bookkeeping of a step, moved to the device once."""
        ids, positions, slots, contexts, rows, logit_rows = [], [], [], [], [], []
        row = 0
        for chunk in chunks:
            seq, end = chunk.seq, chunk.start + chunk.num_tokens
            ids += seq.token_ids[chunk.start : end]
            positions += range(chunk.start, end)
            context = pool.slots(seq.block_table, 0, end)  # (end,)
            slots.append(context[chunk.start :])
            contexts.append(context)
            rows.append((row, chunk.num_tokens))
            logit_rows += [row + offset for offset in chunk.logit_offsets()]
            row += chunk.num_tokens
        lengths = [len(c) for c in contexts]
        decode_chunks = [c for c, (_, n) in enumerate(rows) if n == 1]
        key_pos = torch.arange(max(lengths))
        to = self.device
        return StepLayout(
            input_ids=torch.tensor([ids], device=to),
            positions=torch.tensor([positions], device=to),
            slots=torch.cat(slots).to(to),
            context_slots=torch.nn.utils.rnn.pad_sequence(contexts, batch_first=True).to(to),
            context_lengths=lengths,
            rows=rows,
            decode_chunks=torch.tensor(decode_chunks, dtype=torch.long, device=to),
            decode_rows=torch.tensor([rows[c][0] for c in decode_chunks], dtype=torch.long, device=to),
            decode_mask=(key_pos[None, :] < torch.tensor([lengths[c] for c in decode_chunks])[:, None]).to(to),
            logit_rows=torch.tensor(logit_rows, dtype=torch.long, device=to),
        )

    @torch.inference_mode()
    def forward(
        self,
        layout: StepLayout,
        pool: PagedKVPool,
        pixel_values: torch.Tensor | None = None,
        all_layers: bool = False,
    ) -> torch.Tensor:
        """float32 logits (S, vocab) at `layout.logit_rows`; writes every new token's KV to the pool.
        `pixel_values` (num_images, 3, H, W): the images whose tokens are in this step, in order.
        `all_layers`: the logit lens of the pass instead, float32 (L + 1, S, vocab): the final norm
        and output layer on the hidden state after the embedding and after each layer, the last
        row being the pass's own logits."""
        images = {} if pixel_values is None else {"pixel_values": pixel_values}
        token = _ACTIVE.set(StepKV(pool, layout))
        restore = self._language_attention()
        try:
            out = self.model(
                input_ids=layout.input_ids,
                position_ids=layout.positions,
                past_key_values=_ACTIVE.get(),
                use_cache=True,
                logits_to_keep=layout.logit_rows,
                output_hidden_states=all_layers,
                **images,
            )
        finally:
            restore()
            _ACTIVE.reset(token)
        logits = out.logits[0].float()  # (S, vocab)
        if not all_layers:
            return logits
        norm, head = final_norm(self.model), self.model.get_output_embeddings()
        # transformers' last hidden state already went through the final norm: its row is `logits`
        layers = [head(norm(h[0, layout.logit_rows])).float() for h in out.hidden_states[:-1]]
        return torch.stack([*layers, logits])
