"""The demo DeepSeek-V3-architecture model: real architecture, RANDOM weights.

Owns: the scaled-down `DeepseekV3Config` (MLA with a low-rank query and a 32-value latent, 16
routed experts in 4 groups of which 2 are kept per token, 4 experts + 1 shared per token, the
first layer dense), building it once with a fixed seed and the bundled model's tokenizer (so
its chat template and vocabulary are SmolLM2's), and saving it as a plain Hugging Face folder
under `<data dir>/models/` with a `demo.json` marker saying its weights are random.
Must not know: Django (the `demo_model` management command registers it), engine settings.

Its text is noise: nothing was trained. It exists so MLA's compressed cache, the router's
choices and the architecture card can be seen on a model that runs through the whole product.
CLI: `python -m inference.models.demo [--data-dir DIR]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DeepseekV3Config

from inference.models.bundled import ensure_bundled_model, say
from inference.sources import RANDOM_WEIGHTS_MARKER

DEMO_FOLDER_NAME = "deepseek-v3-demo-random"
DEMO_MODEL_NAME = "DeepSeek-V3 architecture demo (random weights)"
DEMO_SEED = 20241226  # DeepSeek-V3's release date: any fixed seed gives the same weights everywhere
MARKER_NAME = RANDOM_WEIGHTS_MARKER  # what the web process reads (`has_random_weights`)
DEMO_FORMAT = 1  # bump when the config or the build changes: the folder is rebuilt


def demo_model_dir(data_dir: str | Path) -> Path:
    return Path(data_dir) / "models" / DEMO_FOLDER_NAME


def demo_config(vocab_size: int, bos_token_id: int | None, eos_token_id: int | None) -> DeepseekV3Config:
    """DeepSeek-V3's layout at 1/56 of its width: same parts, same routing rule, tiny sizes."""
    return DeepseekV3Config(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=384,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=64,
        kv_lora_rank=32,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
        n_routed_experts=16,
        n_shared_experts=1,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )


def build_demo_model(tokenizer) -> torch.nn.Module:
    """The model with seeded random weights; the same seed gives the same weights."""
    config = demo_config(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(DEMO_SEED)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # V3's correction bias is learned; at zero every expert ties. Random bias and a wider
        # router make the choices differ between tokens, as trained routing does.
        for module in model.modules():
            bias = getattr(module, "e_score_correction_bias", None)
            if isinstance(bias, torch.Tensor):
                bias.data.normal_(0.0, 0.05)
                module.weight.data.normal_(0.0, 0.2)
    return model.eval()


def is_complete(folder: Path, demo_format: int = DEMO_FORMAT) -> bool:
    try:
        marker = json.loads((folder / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("format") == demo_format and marker.get("random_weights") is True


def ensure_demo_model(data_dir: str | Path, progress=None, out_dir: str | Path | None = None) -> Path:
    """The demo folder (`out_dir`, by default under `data_dir`, whose bundled model gives the
    tokenizer), built on first use (a few seconds); moved into place whole."""
    out_dir = Path(out_dir) if out_dir is not None else demo_model_dir(data_dir)
    if is_complete(out_dir):
        return out_dir
    tokenizer = AutoTokenizer.from_pretrained(ensure_bundled_model(data_dir, progress))
    say(progress, f"building the random-weights DeepSeek-V3 demo model into {out_dir}")
    marker = {"format": DEMO_FORMAT, "random_weights": True, "seed": DEMO_SEED, "name": DEMO_MODEL_NAME}
    return write_demo_folder(out_dir, [build_demo_model(tokenizer), tokenizer], marker)


def write_demo_folder(out_dir: Path, parts: list, marker: dict) -> Path:
    """Save every part (`save_pretrained`) and the marker into a staging folder, then move it
    into place whole: a crash never leaves a half-written demo that looks complete."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        for part in parts:
            part.save_pretrained(staging)
        (staging / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n")
        staging.chmod(0o755)
        shutil.rmtree(out_dir, ignore_errors=True)
        os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("PLAYGROUND_DATA_DIR") or "data")
    args = parser.parse_args(argv)
    print(ensure_demo_model(args.data_dir, progress=print))
    return 0


if __name__ == "__main__":
    sys.exit(main())
