"""Which sampling preset gives a first-time chat user coherent answers? Runs every shipped
preset (and a few candidates) on the bundled model, in-process, over everyday questions and
seeds, judges each answer with scripts/coherence.py, prints a table and the best preset.

    .venv/bin/python scripts/measure_presets.py                # 10 questions x 20 seeds
    .venv/bin/python scripts/measure_presets.py --quick        # 10 questions x 5 seeds
    .venv/bin/python scripts/measure_presets.py --questions 4 --seeds 3 --max-new-tokens 32

Each question is one chat turn rendered with the model's own template (as the chat page does,
no system prompt); all seeds of a question run together in the engine's continuous batch.
Greedy and beam search ignore the seed: they run once per question and count once per seed.
Answers are cut at `--max-new-tokens` (a garbled start shows in the first tokens already).
Owns: the question set, the candidate settings and the table. Must not know: Django (the
shipped presets are read from their data migration's plain list).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script

from inference.config import EngineConfig
from inference.engine import Engine
from inference.events import Finished
from inference.sampling_params import SamplingParams
from scripts.coherence import judge

QUESTIONS: list[tuple[str, tuple[str, ...]]] = [  # (question, known answers; () = open question)
    ("What is the capital of France?", ("Paris",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What is the largest planet in our solar system?", ("Jupiter",)),
    ("Who wrote Romeo and Juliet?", ("Shakespeare",)),
    ("What is the boiling point of water in Celsius?", ("100",)),
    ("What is 2 + 2?", ("4", "four")),
    ("Give me one tip for sleeping better.", ()),
    ("Suggest a name for a pet cat.", ()),
    ("Why do people need to drink water?", ()),
]
# Settings worth comparing with the shipped presets (lower temperature, a min-p floor).
CANDIDATES: list[dict] = [
    {"name": "T 0.5, top-p 0.9", "temperature": 0.5, "top_p": 0.9},
    {"name": "T 0.7, min-p 0.1", "temperature": 0.7, "min_p": 0.1},
]
PRESET_FIELDS = set(SamplingParams.__dataclass_fields__)


@dataclass
class Tally:
    num_coherent: int = 0
    num_answers: int = 0
    num_wrong: int = 0  # factual questions answered in English but without the known answer
    num_not_english: int = 0  # mixed-language or non-Latin text
    num_garbled: int = 0
    example_failure: str = ""

    def add(self, reason: str, text: str, weight: int) -> None:
        self.num_answers += weight
        self.num_coherent += weight * (reason == "ok")
        self.num_wrong += weight * (reason == "wrong-answer")
        self.num_not_english += weight * (reason == "not-english")
        self.num_garbled += weight * (reason in ("garbled", "empty"))
        if reason != "ok" and not self.example_failure:
            self.example_failure = text.strip().replace("\n", " ")[:60]

    @property
    def rate(self) -> float:
        return self.num_coherent / self.num_answers if self.num_answers else 0.0


def shipped_presets() -> list[dict]:
    migration = importlib.import_module("playground.migrations.0002_bundled_model_and_presets")
    return [dict(p) for p in migration.PRESETS]


def preset_params(preset: dict, max_new_tokens: int, seed: int) -> SamplingParams:
    fields = {k: v for k, v in preset.items() if k in PRESET_FIELDS}
    fields["max_new_tokens"] = min(max_new_tokens, fields.get("max_new_tokens", max_new_tokens))
    return SamplingParams.from_dict({**fields, "seed": seed})


def is_deterministic(params: SamplingParams) -> bool:
    return params.is_greedy or params.is_beam_search


def answers(engine: Engine, prompt_ids: list[int], params: list[SamplingParams]) -> list[str]:
    """The answer of each request, all run together in the engine's batch."""
    ids = [engine.add_request(prompt_ids, p) for p in params]
    texts: dict[int, str] = {}
    while engine.has_unfinished:
        for request_id, event in engine.step():
            if isinstance(event, Finished):
                texts[request_id] = event.text
    return [texts[i] for i in ids]


def measure(engine: Engine, preset: dict, num_questions: int, num_seeds: int, max_new_tokens: int) -> Tally:
    tally = Tally()
    for question, expected in QUESTIONS[:num_questions]:
        prompt_ids = engine.prompts.encode(engine.prompts.render_chat([{"role": "user", "content": question}]).text)
        params = [preset_params(preset, max_new_tokens, seed) for seed in range(num_seeds)]
        weight = 1
        if is_deterministic(params[0]):  # every seed gives the same answer
            params, weight = params[:1], num_seeds
        for text in answers(engine, prompt_ids, params):
            tally.add(judge(text, expected).reason, text, weight)
    return tally


def print_table(rows: list[tuple[str, Tally, float]]) -> None:
    print("| preset | coherent | wrong answer | not English | garbled | seconds | a failure |")
    print("|---|---|---|---|---|---|---|")
    for name, t, seconds in rows:
        print(
            f"| {name} | {t.num_coherent}/{t.num_answers} ({t.rate:.0%}) | {t.num_wrong} | {t.num_not_english} "
            f"| {t.num_garbled} | {seconds:.0f} | {t.example_failure!r} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=len(QUESTIONS), help="how many of the 10 questions")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per question (sampling presets)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="5 seeds per question")
    parser.add_argument("--dtype", default="auto", help="weight precision (as the worker's default)")
    args = parser.parse_args()
    if not 1 <= args.questions <= len(QUESTIONS):
        raise ValueError(f"--questions={args.questions} must be between 1 and {len(QUESTIONS)}")
    if args.seeds < 1 or args.max_new_tokens < 1:
        raise ValueError(f"--seeds={args.seeds} and --max-new-tokens={args.max_new_tokens} must be at least 1")
    num_seeds = 5 if args.quick else args.seeds
    engine = Engine.load(EngineConfig(source="bundled", dtype=args.dtype), progress=print)
    rows = []
    for preset in shipped_presets() + CANDIDATES:
        started = time.perf_counter()
        tally = measure(engine, preset, args.questions, num_seeds, args.max_new_tokens)
        rows.append((preset["name"], tally, time.perf_counter() - started))
        print(f"{preset['name']}: {tally.rate:.0%} coherent", flush=True)
    print(f"\n{args.questions} questions x {num_seeds} seeds, {args.max_new_tokens} new tokens at most\n")
    print_table(rows)
    best = max(rows, key=lambda row: row[1].rate)
    print(f"\nbest: {best[0]} ({best[1].rate:.0%} coherent)")


if __name__ == "__main__":
    main()
