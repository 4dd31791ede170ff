"""The demo DeepSeek-VL-architecture model: real architecture and image processor, RANDOM weights.

Owns: the scaled-down `DeepseekVLConfig` (a SigLIP vision tower on 112-pixel images in 14-pixel
patches, so 8x8 = 64 image tokens per image; DeepSeek-VL's two-layer aligner; a small Llama
language model with grouped-query attention), its image processor (DeepSeek-VL's: resize the
longest side, pad to a square with the mean colour, CLIP normalisation), the bundled model's
tokenizer with DeepSeek-VL's `<image_placeholder>` token added, and saving it all as a plain
Hugging Face folder under `<data dir>/models/` with a `demo.json` marker saying its weights are
random. Must not know: Django (the `demo_vl_model` management command registers it).

Its text is noise and it has never seen a picture: nothing was trained. It exists so an image's
path through the product (pixels -> vision tower -> a block of image tokens -> their KV cache,
prefix reuse by content hash, prefill/decode hand-over) runs for real on a CPU.
DeepSeek-VL2 itself (dynamic tiling, a MoE language model) ships as remote code; its image-token
counts are on the architecture card. CLI: `python -m inference.models.vl_demo [--data-dir DIR]`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText, AutoTokenizer, DeepseekVLConfig
from transformers.models.deepseek_vl.image_processing_pil_deepseek_vl import DeepseekVLImageProcessorPil

from inference.models.bundled import ensure_bundled_model, say
from inference.models.demo import is_complete, write_demo_folder

VL_DEMO_FOLDER_NAME = "deepseek-vl-demo-random"
VL_DEMO_MODEL_NAME = "DeepSeek-VL architecture demo (random weights)"
VL_DEMO_SEED = 20240308  # DeepSeek-VL's release date: any fixed seed gives the same weights everywhere
VL_DEMO_FORMAT = 1  # bump when the config or the build changes: the folder is rebuilt
IMAGE_TOKEN = "<image_placeholder>"  # DeepSeek-VL's own image token
IMAGE_SIZE = 112
PATCH_SIZE = 14


def vl_demo_model_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / "models" / VL_DEMO_FOLDER_NAME


def vl_demo_tokenizer(bundled_dir: Path):
    """SmolLM2's tokenizer (and chat template) with the image token added as a special token."""
    tokenizer = AutoTokenizer.from_pretrained(bundled_dir)
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    return tokenizer


def vl_demo_config(tokenizer) -> DeepseekVLConfig:
    """DeepSeek-VL's layout (SigLIP tower -> aligner -> Llama) at toy sizes."""
    return DeepseekVLConfig(
        text_config={
            "model_type": "llama",
            "vocab_size": len(tokenizer),
            "hidden_size": 128,
            "intermediate_size": 256,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
        },
        vision_config={
            "model_type": "siglip_vision_model",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": IMAGE_SIZE,
            "patch_size": PATCH_SIZE,
        },
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
    )


def vl_demo_image_processor() -> DeepseekVLImageProcessorPil:
    return DeepseekVLImageProcessorPil(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})


def build_vl_demo_model(tokenizer) -> torch.nn.Module:
    """The model with seeded random weights; the same seed gives the same weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(VL_DEMO_SEED)
        model = AutoModelForImageTextToText.from_config(vl_demo_config(tokenizer), dtype=torch.float32)
    return model.eval()


def ensure_vl_demo_model(data_dir: str | Path, progress=None, out_dir: str | Path | None = None) -> Path:
    """The demo folder (`out_dir`, by default under `data_dir`, whose bundled model gives the
    tokenizer), built on first use (a few seconds); moved into place whole."""
    out_dir = Path(out_dir) if out_dir is not None else vl_demo_model_dir(data_dir)
    if is_complete(out_dir, VL_DEMO_FORMAT):
        return out_dir
    tokenizer = vl_demo_tokenizer(ensure_bundled_model(data_dir, progress))
    say(progress, f"building the random-weights DeepSeek-VL demo model into {out_dir}")
    marker = {"format": VL_DEMO_FORMAT, "random_weights": True, "seed": VL_DEMO_SEED, "name": VL_DEMO_MODEL_NAME}
    parts = [build_vl_demo_model(tokenizer), tokenizer, vl_demo_image_processor()]
    return write_demo_folder(out_dir, parts, marker)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("PLAYGROUND_DATA_DIR") or "data")
    args = parser.parse_args(argv)
    print(ensure_vl_demo_model(args.data_dir, progress=print))
    return 0


if __name__ == "__main__":
    sys.exit(main())
