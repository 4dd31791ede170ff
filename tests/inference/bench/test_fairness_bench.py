"""The fairness benchmark (`python -m inference.bench fairness`): the loads user A sends and its
arguments. Nothing here is timed and nothing starts the stack (the benchmark itself does)."""

from __future__ import annotations

import pytest

from inference.bench.fairness import LONG_PROMPT_CHARS, load_commands, parse_args


def test_the_long_prompt_load_is_two_different_prompts_each_within_the_sites_limit() -> None:
    commands = load_commands("long_prompts", model_id=7)
    texts = [c["content"] for c in commands]
    assert len(texts) == 2 and texts[0] != texts[1]
    assert all(LONG_PROMPT_CHARS - 100 < len(t) <= LONG_PROMPT_CHARS for t in texts)
    assert all(c["model_id"] == 7 and c["overrides"]["use_prefix_cache"] is False for c in commands)


def test_the_no_kv_load_is_one_request_that_recomputes_every_step() -> None:
    (command,) = load_commands("no_kv", model_id=1)
    assert command["overrides"]["use_kv_cache"] is False
    assert 1_500 < len(command["content"].split()) < 2_000  # about 2,000 tokens
    assert load_commands("none", model_id=1) == []


def test_quick_takes_fewer_samples_and_unknown_loads_are_refused(capsys) -> None:
    assert (parse_args(["--quick"]).num_samples, parse_args([]).num_samples) == (3, 10)
    assert parse_args(["--loads", "no_kv"]).load_names == ["no_kv"]
    with pytest.raises(SystemExit):
        parse_args(["--loads", "none,everything"])
    assert "everything" in capsys.readouterr().err
