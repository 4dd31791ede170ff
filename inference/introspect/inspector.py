"""The explorer's exact views of a finished generation, computed on the served model.

Owns: running `inference.introspect`'s views (prompt logprobs, the KV cache's bytes, MoE
routing, the roofline and timeline, an A/B of two settings, the logit lens, waterfall and
what-if, a precision comparison) on an engine's model and naming every token they mention.
The worker calls this, on its engine loop thread, instead of touching tensors itself.
Must not know: Django, the rows the token ids came from, sockets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inference.sampling_params import SamplingParams

if TYPE_CHECKING:
    from inference.engine import Engine

PIECE_KEYS = ("token_id", "original_token_id", "sampled_token_id", "a_token_id", "b_token_id")


class Inspector:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def prompt_logprobs(self, prompt_ids: list[int], top_n: int) -> list[dict[str, Any]]:
        from inference.introspect.prompt_logprobs import prompt_logprobs

        tokens = prompt_logprobs(self.engine.passes.score, prompt_ids, top_n)
        for token in tokens:
            token["token_bytes"] = self.engine.prompts.table.bytes_of(token["token_id"]).hex()
        return self.named(tokens)

    def ab(
        self, context_ids: list[int], a: tuple[list[int], SamplingParams], b: tuple[list[int], SamplingParams]
    ) -> dict[str, Any]:
        """Side A (path, settings) against side B, each path teacher-forced after the same text."""
        from inference.introspect.ab import Side, compare
        from inference.introspect.recompute import replay

        side_a, side_b = (Side(replay(self.engine, context_ids, path), params) for path, params in (a, b))
        return self.named(compare(side_a, side_b))

    def view(
        self, view: str, step: int, layer: int | None, top_n: int, params: SamplingParams, context_ids, path
    ) -> dict[str, Any]:
        """The logit lens, the waterfall or the what-if replay of step `step` of `path`."""
        from inference.introspect.recompute import replay
        from inference.introspect.waterfall import waterfall
        from inference.introspect.whatif import what_if
        from inference.sampling.logits import penalized_ids

        if view == "lens":
            return {
                "step": step,
                **self.named(self._lens(context_ids + path, len(context_ids) + step - 1, layer, top_n)),
            }
        again = replay(self.engine, context_ids, path if view == "whatif" else path[: step + 1])
        if view == "waterfall":
            context_ids = penalized_ids(again.context(step), again.num_prompt_tokens, params)
            fall = waterfall(again.logits(step), context_ids, params, sampled_token_id=path[step], top_n=top_n)
            return {"step": step, "params": params.to_dict(), **self.named(fall)}
        return self.named(what_if(again, params, top_n=min(top_n, 10)))

    def _lens(self, ids: list[int], position: int, layer: int | None, top_n: int) -> dict[str, Any]:
        """The logit lens of the token at `position` (read last before the step it predicts), its
        embedding and, when `layer` is given, that layer's attention."""
        from inference.introspect import lens

        model, top_n = self.engine.model, min(top_n, 10)
        num_layers = model.config.get_text_config().num_hidden_layers
        if not 0 <= position < len(ids):
            raise ValueError(f"position {position} is outside the sequence (0..{len(ids) - 1})")
        context = ids[: position + 1]
        seen: dict[str, Any] = {
            "position": position,
            "token_id": ids[position],
            "lens": lens.lens_rows(self.engine.passes.read_layers(context), top_n),
            "embedding": lens.embedding_of(model, ids[position], top_n=top_n),
            "num_layers": num_layers,
            "context": [{"token_id": i} for i in context],
        }
        if layer is not None:
            seen["attention"] = {"layer": layer, "weights": lens.attention_of(model, context, layer)}
        return seen

    def kv(self, num_tokens: int, num_cached: int) -> dict[str, Any]:
        """The KV cache of a request of `num_tokens` tokens, `num_cached` of them reused."""
        from inference.introspect import kv

        shape = kv.kv_shape(self.engine.model)
        return {
            "shape": shape,
            "measured_bytes_per_token": self.engine.info.kv_bytes_per_token,
            # The cache holds every position but the last token's (whose keys were never computed).
            "request": kv.request_kv(shape, max(num_tokens - 1, 0), num_cached),
            "dtype": self.engine.info.dtype,
        }

    def moe(self, context_ids: list[int], path: list[int]) -> dict[str, Any]:
        """Per step: the routing of the forward pass that predicted it, i.e. of the token read last
        before it (the text's last token for step 0, then path[k-1]). `NotMoE` on a dense model."""
        from inference.introspect.moe import routing_trace

        trace = routing_trace(self.engine.model, context_ids + path[:-1], first_position=len(context_ids) - 1)
        for step, token in enumerate(trace["tokens"]):
            token.update(step=step, sampled_token_id=path[step])
        return self.named(trace)

    def roofline(
        self, stats: dict[str, Any], steps: list[dict[str, Any]], num_prompt: int, num_cached: int
    ) -> dict[str, Any]:
        """Where the request's prefill and decode steps sit on this device's roofline
        (`ArchitectureError` when the model's shape cannot be read)."""
        from inference.introspect import kv
        from inference.introspect.architecture import shape_from_config
        from inference.introspect.device_limits import device_limits
        from inference.introspect.roofline import roofline
        from inference.introspect.timeline import timeline

        engine = self.engine
        result = roofline(
            shape_from_config(engine.model.config.to_dict()),
            device_limits(engine.device, engine.loaded.dtype),
            num_prompt=num_prompt,
            num_cached=num_cached,
            element_bytes=kv.kv_shape(engine.model)["element_bytes"],
            prefill_ms=stats["prefill_ms"],
            decode_steps=[(step["index"], step["latency_ms"]) for step in steps if step.get("phase") == "decode"],
        )
        return {"timeline": timeline(stats, steps), **result}

    def precision(self, other, context_ids: list[int], path: list[int], top_n: int) -> dict[str, Any]:
        """The path under the served weights and under `other` (a `LoadedModel` in another precision)."""
        from inference.introspect.precision import compare_precisions
        from inference.introspect.recompute import replay

        result = self.named(compare_precisions(replay(self.engine, context_ids, path), other.model, top_n))
        return {"served_precision": self.engine.info.precision, "other_precision": other.precision, **result}

    def named(self, value: Any) -> Any:
        """Adds each token's piece next to its id, recursively."""
        if isinstance(value, dict):
            named = {key: self.named(item) for key, item in value.items()}
            for key in PIECE_KEYS:
                if isinstance(value.get(key), int):
                    named[key.replace("token_id", "piece")] = self.engine.prompts.piece(value[key])
            return named
        if isinstance(value, list):
            return [self.named(item) for item in value]
        return value
