"""What a loaded model is, as every other part of the system reads it (`ModelInfo`).

Owns: the one description of a served model (architecture, sizes, precision, device, the KV
cache's geometry and bytes per token, which runner and kernels run it, MoE and vision
settings), fixed for the engine's life. Plain data: `to_dict()` crosses process boundaries.
Must not know: requests, Django.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from inference.models.loader import LoadedModel, architecture_of
from inference.models.precision import weight_stats
from inference.models.runner import ModelRunner
from inference.vision.encoder import VisionSpec


@dataclass(frozen=True)
class ModelInfo:
    name: str
    architecture: str
    model_type: str
    num_params: int
    weight_bytes: int
    num_layers: int | None
    hidden_size: int | None
    vocab_size: int | None
    dtype: str
    precision: str
    quantization: dict[str, Any] | None
    device: str
    max_context: int
    eos_token_ids: list[int]
    kv_bytes_per_token: int
    runner: str
    kernels: str  # what runs between the matmuls: "fused CPU kernels" or "torch ops"
    batch_invariant: bool  # the same numbers alone or batched, chunked or not, cold or cached
    has_chat_template: bool
    sliding_window: int | None
    num_moe_layers: int  # 0: dense; the explorer offers the MoE view if > 0
    moe: dict[str, Any] | None  # None: dense; else how to read a step's `moe_routing`
    vision: dict[str, Any] | None  # None: the model takes no images

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def describe(cls, loaded: LoadedModel, runner: ModelRunner, vision: VisionSpec | None) -> ModelInfo:
        model = loaded.model
        cfg = model.config.get_text_config()  # a vision-language model's language half
        num_params, weight_bytes = weight_stats(model)
        dtype = str(loaded.dtype).removeprefix("torch.")
        return cls(
            name=loaded.name,
            architecture=architecture_of(model),
            model_type=getattr(cfg, "model_type", ""),
            num_params=num_params,
            weight_bytes=weight_bytes,
            num_layers=getattr(cfg, "num_hidden_layers", None),
            hidden_size=getattr(cfg, "hidden_size", None),
            vocab_size=getattr(cfg, "vocab_size", None),
            dtype=dtype,
            precision=loaded.precision or dtype,
            quantization=loaded.quantization.to_dict() if loaded.quantization else None,
            device=str(loaded.device),
            max_context=loaded.max_context,
            eos_token_ids=list(loaded.eos_token_ids),
            kv_bytes_per_token=runner.bytes_per_token,
            runner=runner.name,
            kernels=runner.kernels,
            batch_invariant=runner.is_batch_invariant,
            has_chat_template=bool(loaded.chat_template),
            sliding_window=sliding_window_of(cfg),
            num_moe_layers=len(runner.routing.routers),
            moe=runner.routing.settings,
            vision=vision.to_dict() if vision else None,
        )


def sliding_window_of(cfg: Any) -> int | None:
    """Tokens of attention window when the model uses one; None otherwise."""
    window = getattr(cfg, "sliding_window", None)
    return window if window and getattr(cfg, "use_sliding_window", True) else None
