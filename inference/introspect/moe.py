"""Mixture-of-experts routing made visible: which experts each MoE layer chose for each token,
and with what weight.

Owns: finding a model's routers (DeepSeek-V3's `gate` modules: group-limited top-k over sigmoid
scores, the correction bias used only to choose), capturing their outputs with forward hooks
during one batch-1 forward pass (hooks always removed afterwards), the compact per-position
record of a choice (shared by the inspection's `routing_trace` and the engine's `PassRouting`,
which records each generation step's real forward pass), and `recompute_routing`, an
independent implementation of V3's rule from the router logits (what the tests check the
captured choices against). Must not know: requests, the engine's scheduling, Django.

The pass is an inspection pass over the prompt and the generated tokens at once (no cache):
a causal model routes position t from tokens 0..t only, so each position's choice is the one it
got while it was generated (up to float rounding between a cached and an uncached pass).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

_LAYER_INDEX = re.compile(r"layers\.(\d+)\.")


def find_routers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, router) for every MoE layer: a module with V3's routing attributes."""
    routers = []
    for name, module in model.named_modules():
        if all(hasattr(module, a) for a in ("top_k", "e_score_correction_bias", "topk_group", "weight")):
            match = _LAYER_INDEX.search(name + ".")
            routers.append((int(match.group(1)) if match else len(routers), module))
    return routers


@contextmanager
def capture_routing(
    model: torch.nn.Module, routers: list[tuple[int, torch.nn.Module]] | None = None
) -> Iterator[dict[int, dict[str, torch.Tensor]]]:
    """Inside the block every router's forward pass records {logits, weights, indices} (one row
    per token) under its layer index; the hooks are removed on leaving, error or not.
    `routers`: `find_routers(model)` when the caller already has them (saves walking the modules)."""
    captured: dict[int, dict[str, torch.Tensor]] = {}
    handles = []

    def hook_for(layer: int):
        def hook(module: torch.nn.Module, inputs: Any, output: Any) -> None:
            logits, weights, indices = output
            captured[layer] = {"logits": logits.detach(), "weights": weights.detach(), "indices": indices.detach()}

        return hook

    try:
        for layer, router in find_routers(model) if routers is None else routers:
            handles.append(router.register_forward_hook(hook_for(layer)))
        yield captured
    finally:
        for handle in handles:
            handle.remove()


class NotMoE(ValueError):
    """The model has no mixture-of-experts router (a dense model): there is no routing to show."""


def recompute_routing(
    logits: torch.Tensor,
    bias: torch.Tensor,
    *,
    num_experts_per_tok: int,
    n_group: int,
    topk_group: int,
    norm_topk_prob: bool,
    routed_scaling_factor: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V3's rule from router logits (tokens, experts), one token at a time: sigmoid scores; the
    choice uses score + bias; a group's strength is the sum of its 2 best biased scores; keep
    the `topk_group` strongest groups; the `num_experts_per_tok` experts inside them; their
    weights are the unbiased scores, normalised to sum 1 (if `norm_topk_prob`) and times
    `routed_scaling_factor`.
    Returns (weights, indices), each (tokens, num_experts_per_tok), experts in descending chosen score."""
    scores = logits.float().sigmoid()
    num_experts = scores.shape[-1]
    per_group = num_experts // n_group
    all_weights, all_indices = [], []
    for row in scores:
        biased = (row + bias.float()).tolist()
        groups = [sorted(biased[g * per_group : (g + 1) * per_group], reverse=True) for g in range(n_group)]
        strength = [sum(values[:2]) for values in groups]
        kept = sorted(range(n_group), key=lambda g: -strength[g])[:topk_group]
        candidates = [e for e in range(num_experts) if e // per_group in kept]
        chosen = sorted(candidates, key=lambda e: -biased[e])[:num_experts_per_tok]
        weights = row[chosen]
        if norm_topk_prob:
            weights = weights / (weights.sum() + 1e-20)
        all_weights.append(weights * routed_scaling_factor)
        all_indices.append(torch.tensor(chosen))
    return torch.stack(all_weights), torch.stack(all_indices)


def router_settings(router: torch.nn.Module) -> dict[str, Any]:
    """The router's routing rule under the config's names (`recompute_routing`'s keywords)."""
    return {
        "num_experts_per_tok": int(router.top_k),
        "n_group": int(getattr(router, "num_group", getattr(router, "n_group", 1))),
        "topk_group": int(router.topk_group),
        "norm_topk_prob": bool(router.norm_topk_prob),
        "routed_scaling_factor": float(router.routed_scaling_factor),
    }


def routing_settings(model: torch.nn.Module, routers: list[tuple[int, torch.nn.Module]]) -> dict[str, Any]:
    """What a routing record needs to be read: the MoE layers, the expert count and grouping, and
    the routing rule (the config's names). `NotMoE` when the model has no router."""
    if not routers:
        raise NotMoE("this model has no mixture-of-experts router to trace")
    settings = router_settings(routers[0][1])
    num_experts = int(routers[0][1].num_experts)
    layers = [layer for layer, _ in routers]
    return {
        "layers": layers,
        "n_routed_experts": num_experts,
        "experts_per_group": num_experts // settings["n_group"],
        "first_k_dense_replace": int(getattr(model.config, "first_k_dense_replace", layers[0])),
        **settings,
    }


def choice_at(captured: dict[str, torch.Tensor], position: int, per_group: int) -> dict[str, list]:
    """One layer's choice for one position: experts in descending weight, their weights (rounded
    to 5 decimals: a view, not a checkpoint) and the groups they came from."""
    weights, indices = captured["weights"][position], captured["indices"][position]  # (k,)
    order = torch.argsort(weights, descending=True)
    experts = indices[order].tolist()
    return {
        "experts": experts,
        "weights": [round(w, 5) for w in weights[order].tolist()],
        "groups": sorted({e // per_group for e in experts}),
    }


@torch.inference_mode()
def routing_trace(model: torch.nn.Module, token_ids: list[int], first_position: int = 0) -> dict[str, Any]:
    """One forward pass over `token_ids`; for each position from `first_position` on, each MoE
    layer's `choice_at`, with `routing_settings`. `NotMoE` when the model has no router."""
    routers = find_routers(model)
    settings = routing_settings(model, routers)
    device = next(model.parameters()).device
    with capture_routing(model, routers) as captured:
        model(input_ids=torch.tensor([token_ids], device=device), use_cache=False, logits_to_keep=1)
    per_group = settings["experts_per_group"]
    tokens = [
        {
            "position": position,
            "token_id": token_ids[position],
            "layers": [choice_at(captured[layer], position, per_group) for layer in settings["layers"]],
        }
        for position in range(first_position, len(token_ids))
    ]
    return {**settings, "tokens": tokens}


class PassRouting:
    """The routing of a generation's own forward passes, for its step records: on a model with
    routers, `at_rows(rows)` hooks them for one pass and gives, for each of the pass's `rows`
    (the positions the next tokens are predicted from), each MoE layer's choice. On a dense model
    it installs nothing: the dense forward pass stays as fast as without it."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.routers = find_routers(model)
        self.settings = routing_settings(model, self.routers) if self.routers else None

    def __bool__(self) -> bool:
        return bool(self.routers)

    @contextmanager
    def at_rows(self, rows: list[int]) -> Iterator[list[tuple[dict[str, Any], ...]]]:
        """The list, empty for a dense model, is filled on leaving with one tuple per row: a
        `choice_at` per MoE layer (plus its "layer" index), in `settings["layers"]` order."""
        routing: list[tuple[dict[str, Any], ...]] = []
        if not self.routers:
            yield routing
            return
        with capture_routing(self.model, self.routers) as captured:
            yield routing
        per_group = self.settings["experts_per_group"]
        routing.extend(
            tuple({"layer": layer, **choice_at(captured[layer], row, per_group)} for layer, _ in self.routers)
            for row in rows
        )
