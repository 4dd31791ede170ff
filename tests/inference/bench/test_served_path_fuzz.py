"""The differential fuzz of the served path (`python -m inference.bench fuzz`), a seeded slice on a
tiny random Llama: one engine with a small KV pool takes a random mix arriving between its steps
(shared and diverging prefixes, the prefix cache on and off, no-KV runs, n choices, beams, stops,
cancels, preemption, PD handoffs, teacher forcing / scores / the lens stepping the batch between
their chunks, a second model and an int8 copy loaded and dropped), and every request's tokens
and top-20 raw logprobs, every inspection's logits, equal bitwise the same request's alone on a
cold engine. Then what the fuzz found, pinned: a teacher-forcing pass whose later blocks the
batch took while it stepped.
"""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
import torch

from inference import SamplingParams
from inference.bench.fuzz import recipe, run_fuzz
from inference.bench.fuzz_cases import KINDS
from inference.bench.fuzz_subjects import Subject, tiny_subject
from tests.inference.engines import engine_for

SEED = 6  # a mix that catches the bugs the fuzz found when they are put back (checked by injecting each)


@pytest.fixture(scope="module")
def subject() -> Subject:
    subject = tiny_subject("llama")
    if not subject.engine().model_info()["batch_invariant"]:
        # with a compiler the kernels must build: a broken build must not pass as a skip
        assert not (shutil.which("cc") or shutil.which("gcc")), "a compiler is present but the kernels did not build"
        pytest.skip("no C compiler here: the torch ops are not batch-invariant (docs/inside.md)")
    return subject


def test_a_seeded_mix_gives_every_request_its_numbers_alone_and_cold(subject: Subject) -> None:
    report = run_fuzz(subject, SEED, num_cases=220, max_new_tokens=10)
    replay = f"python -m inference.bench fuzz --model tiny-llama --seed {SEED} --cases 220 --max-new-tokens 10"
    assert not report.mismatches, recipe(report, report.mismatches[0], replay)
    assert report.num_compared >= 200
    assert set(Counter(case.kind for case in report.cases)) == set(KINDS)  # every kind ran
    assert sum(case.cancel_after is not None for case in report.cases) >= 10
    assert report.stats["preemptions"] >= 10 and report.stats["prefix_hits"] >= 10


def test_teacher_forcing_keeps_the_blocks_it_checked_while_its_pace_steps_the_batch() -> None:
    """The pass checked room for its answer tokens but took their blocks only as it wrote them;
    the batch its `pace()` stepped took them first, and the pass found no free block (KeyError)."""
    engine = engine_for("llama", kv_cache_bytes=40 * 4 * 256, max_num_batched_tokens=32)  # 40 blocks of 4
    assert engine.core.block_manager.num_blocks == 40
    engine.add_request(list(range(1, 100)), SamplingParams(greedy=True, max_new_tokens=30, ignore_eos=True))
    engine.passes.pace = lambda: engine.step() and None  # as the worker's loop: a batch step per chunk
    logits = engine.passes.teacher_force(list(range(1, 9)), list(range(10, 50)))
    assert logits.shape[0] == 41 and torch.isfinite(logits).all()
