"""The default model `make run` serves, Qwen2.5-Coder-0.5B-Instruct (Q4_K_M, the bundled download),
through our engine: it answers the lesson's and everyday questions in both languages (greedy,
bfloat16, the default preset and precision on a CPU with bf16 units), and int4 serves each tensor
type of its file as the report says; the lesson's R1 run (section 7) shows an answer at its default
thinking budget. Needs the prepared model (`python -m inference.models.bundled`,
which `make test` and CI run first; here it is prepared if missing)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inference import EngineConfig, SamplingParams, Step
from inference.bench.coherence import judge
from inference.bundled_models import QWEN_CODER
from inference.engine import Engine
from inference.models.bundled import prepare
from inference.models.precision import weight_stats

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


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


def lesson_r1_run() -> tuple[int, int, list[str]]:
    """The lesson's R1 run as the page sends it: the default thinking budget (templates/learn.html),
    the tokens after it (`ANSWER_TOKENS`, static/js/learn_deepseek.js) and the default question
    in English and in Chinese (the catalog's)."""
    html = (REPO / "templates" / "learn.html").read_text()
    budget = re.search(r'id="ld-budget">.*?<option selected>(\d+)</option>', html)
    room = re.search(r"ANSWER_TOKENS = (\d+);", (REPO / "static" / "js" / "learn_deepseek.js").read_text())
    catalog = (REPO / "locale" / "zh_Hans" / "LC_MESSAGES" / "django.po").read_text()
    chinese = re.search(r'msgctxt "lesson example"\nmsgid "Why is the sky blue\?"\nmsgstr "(.+)"', catalog)
    assert budget and room and chinese
    return int(budget[1]), int(room[1]), ["Why is the sky blue?", chinese[1]]


def test_the_lessons_r1_run_shows_an_answer_after_the_forced_end_of_thinking(qwen: Engine) -> None:
    """At 16 thinking tokens the model's thinking ended a sentence, the forced </think> followed,
    then the end of turn: the page showed no answer. At the default budget it answers, both languages."""
    budget, room, questions = lesson_r1_run()
    for question in questions:
        rendered = qwen.prompts.build(messages=[{"role": "user", "content": question}]).text
        prompt = qwen.prompts.build(text=rendered + "<think>\n").token_ids  # the page's prompt: R1's opening
        params = SamplingParams(greedy=True, max_new_tokens=budget + room, max_thinking_tokens=budget)
        events = list(qwen.generate(prompt, params))
        steps, finished = [e for e in events if isinstance(e, Step)], events[-1]
        assert sum(s.is_forced for s in steps) > 0  # the budget ended the thinking
        end_of_turn = set(qwen.info.eos_token_ids)
        text = "".join(s.text_delta for s in steps if not (s.is_reasoning or s.is_forced or s.token_id in end_of_turn))
        assert len(text.strip()) > 10, (question, finished.finish_reason, [s.text_delta for s in steps])
