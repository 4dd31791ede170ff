"""scripts/measure_presets.py and its coherence criterion (scripts/coherence.py): the verdicts
on real answers the bundled model gave, and one tiny measurement on the bundled model."""

from __future__ import annotations

import pytest

from inference import EngineConfig
from inference.engine import Engine
from scripts.coherence import judge
from scripts.measure_presets import measure, preset_params, shipped_presets


@pytest.mark.parametrize(
    ("answer", "expected", "reason"),
    [
        ("The capital of France is Paris.", ("Paris",), "ok"),
        ("Paris.", ("Paris",), "ok"),
        ("La capitale de la France est Paris, une ville magnifique.", ("Paris",), "not-english"),
        ("L'Étoile, la France, est la maquina de la", ("Paris",), "not-english"),
        ("The capital of France is Lyon.", ("Paris",), "wrong-answer"),
        ("Try to keep a regular bedtime and avoid screens.", (), "ok"),
        ("the the the the end", (), "garbled"),
        ("巴黎是法国的首都", ("Paris",), "not-english"),
        ("", (), "empty"),
    ],
)
def test_judge_explains_its_verdict(answer, expected, reason):
    verdict = judge(answer, expected)
    assert verdict.reason == reason
    assert verdict.is_coherent == (reason == "ok")


def test_preset_params_cap_the_length_and_take_the_seed():
    balanced = next(p for p in shipped_presets() if p["name"] == "Balanced")
    params = preset_params(balanced, max_new_tokens=16, seed=3)
    assert (params.temperature, params.top_p, params.seed, params.max_new_tokens) == (0.7, 0.9, 3, 16)


@pytest.fixture(scope="module")
def engine(bundled) -> Engine:
    return Engine(bundled, EngineConfig())


def test_measure_counts_every_seed_and_runs_greedy_once(engine):
    greedy = {"name": "Greedy", "greedy": True}
    tally = measure(engine, greedy, num_questions=2, num_seeds=3, max_new_tokens=12)
    assert tally.num_answers == 6
    assert tally.num_coherent in (0, 3, 6)  # greedy answers each question once, counted per seed
    sampled = measure(engine, {"name": "T1", "temperature": 1.0}, num_questions=1, num_seeds=3, max_new_tokens=8)
    assert sampled.num_answers == 3
    assert sampled.num_coherent + sampled.num_wrong + sampled.num_not_english + sampled.num_garbled == 3
