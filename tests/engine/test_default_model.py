"""The default model `make run` serves, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, the bundled download),
through our engine: it answers the lesson's and everyday questions in both languages (greedy,
bfloat16, the default preset and precision on a CPU with bf16 units), and int4 serves each tensor
type of its file as the report says. Needs the prepared model (`python -m inference.models.bundled`,
which `make test` and CI run first; here it is prepared if missing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference import EngineConfig, SamplingParams
from inference.bench.coherence import judge
from inference.bundled_models import QWEN_CODER
from inference.engine import Engine
from inference.models.bundled import prepare
from inference.models.precision import weight_stats

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen_dir(data_dir: Path) -> Path:
    return prepare(QWEN_CODER, data_dir, progress=print)


@pytest.fixture(scope="module")
def qwen(qwen_dir: Path, data_dir: Path) -> Engine:
    config = EngineConfig(source=QWEN_CODER.source, dtype="bfloat16", data_dir=str(data_dir))
    return Engine.load(config)


def answer(engine: Engine, question: str, max_new_tokens: int) -> str:
    ids = engine.prompts.build(messages=[{"role": "user", "content": question}]).token_ids
    return list(engine.generate(ids, SamplingParams(greedy=True, max_new_tokens=max_new_tokens)))[-1].text


def test_it_answers_in_english_and_in_chinese(qwen: Engine) -> None:
    assert qwen.loaded.name == "Qwen2.5-Coder-0.5B-Instruct"
    assert "Paris" in answer(qwen, "What is the capital of France?", 16)
    assert "北京" in answer(qwen, "中国的首都是哪里？", 16)
    story = answer(qwen, "请给我讲一个故事", 48)  # the lesson's own example
    assert judge(story, language="zh", min_length=30).reason == "ok", story


def test_int4_serves_each_tensor_type_of_the_q4_k_m_file_as_reported(qwen: Engine, data_dir: Path) -> None:
    config = EngineConfig(source=QWEN_CODER.source, dtype="int4", data_dir=str(data_dir))
    int4 = Engine.load(config)
    q = int4.loaded.quantization
    groups = {(g.file_type, g.served_as, g.is_exact, g.is_head): g.num_layers for g in q.groups}
    assert groups == {
        ("Q4_K", "int4", True, False): 12,  # half the ffn_down: the file's own blocks
        ("Q5_0", "int8", False, False): 132,  # most layers: 5-bit blocks, no exact int4 form
        ("Q6_K", "int8", False, False): 12,
        ("Q8_0", "int8", False, False): 12,  # half the attn_v
        ("Q8_0", "int8", False, True): 1,  # the output layer (this file's is not tied)
    }
    assert weight_stats(int4.model)[1] < 0.65 * weight_stats(qwen.model)[1]
    assert "Paris" in answer(int4, "What is the capital of France?", 16)
    del int4
