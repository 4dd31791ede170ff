"""The quality benchmark (`python -m inference.bench quality`): its explainable judge on real
answers the bundled models gave, in English and Chinese, its question set, the presets and the
default it reads from the migrations, and one tiny measurement on the bundled SmolLM2."""

from __future__ import annotations

import importlib

import pytest

from inference import EngineConfig
from inference.bench.coherence import judge
from inference.bench.quality import (
    QUESTIONS,
    Question,
    default_choice,
    main,
    measure,
    pick_questions,
    preset_params,
    shipped_presets,
)
from inference.bundled_models import bundled_model
from inference.engine import Engine

LOOP = "艾丽莎和杰克一起研究这个发现，他们一起发现，人类的基因可以改变自己。"


@pytest.mark.parametrize(
    ("answer", "expected", "language", "min_length", "reason"),
    [
        ("The capital of France is Paris.", ("Paris",), "en", 0, "ok"),
        ("Paris.", ("Paris",), "en", 0, "ok"),
        ("La capitale de la France est Paris, une ville magnifique.", ("Paris",), "en", 0, "wrong-language"),
        # SmolLM2 in bfloat16 (issue 23): French, then a phrase over and over
        ("L'Étoile, la Marseillaise, la femme, la femme, la femme, la femme", ("Paris",), "en", 0, "wrong-language"),
        ("The capital of France is Lyon.", ("Paris",), "en", 0, "wrong-answer"),
        ("Try to keep a regular bedtime and avoid screens.", (), "en", 0, "ok"),
        ("the the the the end", (), "en", 0, "garbled"),
        ("It is blue. It is blue. It is blue. It is blue.", (), "en", 0, "garbled"),
        ("巴黎是法国的首都", ("Paris",), "en", 0, "wrong-language"),
        ("", (), "en", 0, "empty"),
        ("Once upon a time there was a cat.", (), "en", 15, "too-short"),
        # Chinese
        ("中国的首都是北京。", ("北京",), "zh", 0, "ok"),
        ("中国的首都是上海。", ("北京",), "zh", 0, "wrong-answer"),
        ("The capital of China is Beijing.", ("北京",), "zh", 0, "wrong-language"),
        # SmolLM2's answer to the lesson's own example, in every precision (issue 23)
        ("你可能有什么问题？请给我讲一个故事－－－－－－", (), "zh", 20, "garbled"),
        ("从前有一个小女孩，她住在森林边上。", (), "zh", 20, "too-short"),
        ("当然可以！从前，在一个遥远的村庄里，住着一个名叫小明的男孩。他每天都帮助村里的老人。", (), "zh", 20, "ok"),
        ("故事故事故事故事", (), "zh", 0, "garbled"),
        # Qwen2.5-Coder's greedy story past ~100 tokens (the browser check of issue 23): one sentence again and again
        ("在一个遥远的国度，有一个名叫艾丽莎的年轻女孩。" + LOOP * 3, (), "zh", 20, "garbled"),
        ("KV Cache 是一种缓存技术，它保存历史 token 的 Key 和 Value 向量。", (), "zh", 0, "ok"),  # Latin terms too
        # a clause of 29 Han characters is one regex word, not gibberish (Qwen's 32-token answer, 4 December)
        ("KV Cache 是一个缓存系统，它允许开发者在不需要每次都从数据库中获取数据时直接访问缓存。", (), "zh", 0, "ok"),
        ("Supercalifragilisticexpialidociousness is it.", (), "en", 0, "garbled"),  # 34 letters
        ("Yes. ......\n----\n1000000", (), "en", 0, "ok"),  # runs of dots, dashes, digits are layout
    ],
)
def test_judge_explains_its_verdict(answer: str, expected, language: str, min_length: int, reason: str) -> None:
    verdict = judge(answer, expected, language, min_length)
    assert verdict.reason == reason
    assert verdict.is_coherent == (reason == "ok")


def test_judge_refuses_a_language_it_does_not_know() -> None:
    with pytest.raises(ValueError, match="language='fr'"):
        judge("Bonjour", language="fr")


def test_twenty_everyday_questions_per_language_with_the_lessons_own_example_in_the_quick_set() -> None:
    for language in ("en", "zh"):
        asked = [q for q in QUESTIONS if q.language == language]
        assert len(asked) >= 20 and len({q.text for q in asked}) == len(asked)
        assert sum(bool(q.expected) for q in asked) >= 10  # facts with a known answer
    quick = pick_questions(quick=True)
    story = next(q for q in quick if q.text == "请给我讲一个故事")  # lesson-zh.txt: <|user|>请给我讲一个故事
    assert story.language == "zh" and story.min_length >= 20 and story.max_new_tokens >= 128  # long enough to drift
    assert sum(q.language == "zh" for q in quick) == sum(q.language == "en" for q in quick) == 5


def test_the_presets_and_the_default_are_read_from_the_migrations_that_ship_them() -> None:
    later = importlib.import_module("playground.migrations.0015_penalize_prompt_and_answer_only_no_loops")
    shipped = [
        *importlib.import_module("playground.migrations.0002_bundled_model_and_presets").PRESETS,
        *later.PRESETS,  # 0014 shipped "Greedy, no loops", 0015 changed it: the bench runs it as it is now
    ]
    assert shipped_presets() == shipped
    no_loops = next(p for p in shipped_presets() if p["name"] == "Greedy, no loops")
    assert (no_loops["repetition_penalty"], no_loops["penalize_prompt"]) == (1.15, False)
    chosen = importlib.import_module("playground.migrations.0011_bundled_qwen_is_the_default")
    preset = later.PRESET
    assert default_choice() == (chosen.MODEL_SOURCE, chosen.MODEL_DTYPE, preset)
    assert bundled_model(chosen.MODEL_SOURCE) is not None
    assert preset in {p["name"] for p in shipped}
    balanced = next(p for p in shipped if p["name"] == "Balanced")
    params = preset_params(balanced, max_new_tokens=16, seed=3)
    assert (params.temperature, params.top_p, params.seed, params.max_new_tokens) == (0.7, 0.9, 3, 16)


@pytest.fixture(scope="module")
def engine(bundled) -> Engine:
    return Engine(bundled, EngineConfig())


def test_measure_counts_every_seed_per_language_and_runs_greedy_once(engine: Engine) -> None:
    questions = (Question("What is the capital of France?", "en", ("Paris",)), Question("一周有几天？", "zh", ("7",)))
    greedy = measure(engine, {"name": "Greedy", "greedy": True}, questions, num_seeds=3, max_new_tokens=12)
    assert greedy.num_answers == {"en": 3, "zh": 3}
    assert greedy.num_coherent["en"] in (0, 3) and greedy.num_coherent["zh"] in (0, 3)  # once, counted per seed
    assert greedy.num_coherent["zh"] + sum(greedy.reasons.values()) == 6 - greedy.num_coherent["en"]
    sampled = measure(engine, {"name": "T1", "temperature": 1.0}, questions[:1], num_seeds=3, max_new_tokens=8)
    assert sampled.num_answers == {"en": 3, "zh": 0}


def test_an_unknown_preset_is_refused_by_name_before_any_model_loads() -> None:
    with pytest.raises(ValueError, match="--preset='Greedyy' is not a shipped preset"):
        main(["--quick", "--preset", "Greedy", "--preset", "Greedyy"])
