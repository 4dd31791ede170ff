"""Which bundled model, precision and preset gives people coherent answers, in English and in
Chinese, and how fast: `python -m inference.bench quality [--quick]`.

Every bundled model x weight precision x shipped sampling preset answers everyday questions (20
English, 20 Chinese, the lesson's own `请给我讲一个故事` among them; `--quick`: 5 + 5), each one
chat turn rendered with the model's own template (as the chat page sends it, no system prompt),
answers cut at `--max-new-tokens` (the two stories at STORY_TOKENS). Every question of a cell
runs at once in the engine's continuous batch; sampled presets run `--seeds` seeds per question,
greedy and beam search once (counted once per seed). `coherence.judge` explains each verdict.
Speed: the single-stream decode tok/s of each model x precision (greedy, best of 2; the same for
every preset, which changes the choice of tokens, not the work per token) and the wall seconds
of each cell (they include the machine's load: compare within one run).

The shipped presets are read from the data migration that ships them (its plain `PRESETS` list)
and the `make run` default (model, precision, preset) from the migration that chose it, both
parsed, never imported (no Django here). The last line: `key=value` with the default's
`default_en_coherent`, `default_zh_coherent` (fractions) and `default_decode_tok_s`.
Owns: the question set and the table. Must not know: Django.
"""

from __future__ import annotations

import argparse
import ast
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from inference.bench import format_keys
from inference.bench.coherence import judge
from inference.bench.decode import time_ours_decode
from inference.bundled_models import BUNDLED_MODELS, bundled_model
from inference.config import EngineConfig
from inference.engine import Engine
from inference.events import Finished
from inference.models.loader import gguf_source
from inference.models.precision import resolve_precision
from inference.sampling_params import SamplingParams


@dataclass(frozen=True)
class Question:
    text: str
    language: str  # the language the answer should be in: "en" or "zh"
    expected: tuple[str, ...] = ()  # a factual question: one of these must appear
    min_length: int = 0  # a text to write: at least this many words (en) / Han characters (zh)
    max_new_tokens: int | None = None  # its own answer length (a story: long enough to drift); None: the run's


_EN = [
    ("What is the capital of France?", ("Paris",)),
    ("How many days are there in a week?", ("seven", "7")),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What is the largest planet in our solar system?", ("Jupiter",)),
    ("Who wrote Romeo and Juliet?", ("Shakespeare",)),
    ("What is the boiling point of water in Celsius?", ("100",)),
    ("What is 2 + 2?", ("4", "four")),
    ("What is the capital of Japan?", ("Tokyo",)),
    ("How many legs does a spider have?", ("eight", "8")),
    ("What do bees make?", ("honey",)),
    ("Which is the largest ocean on Earth?", ("Pacific",)),
    ("How many minutes are in an hour?", ("60", "sixty")),
    ("What is the opposite of hot?", ("cold",)),
    ("Give me one tip for sleeping better.", ()),
    ("Suggest a name for a pet cat.", ()),
    ("Why do people need to drink water?", ()),
    ("Give me one tip for learning a new language.", ()),
    ("Write one sentence about the sea.", ()),
    ("What is a good breakfast before school?", ()),
]
_ZH = [
    ("中国的首都是哪里？", ("北京",)),
    ("法国的首都是哪里？", ("巴黎",)),
    ("一年有几个月？", ("12", "十二")),
    ("一周有几天？", ("7", "七")),
    ("一天有多少个小时？", ("24", "二十四")),
    ("水在多少摄氏度时沸腾？", ("100", "一百")),
    ("太阳从哪个方向升起？", ("东",)),
    ("地球上最大的海洋是什么？", ("太平洋",)),
    ("大熊猫最喜欢吃什么？", ("竹",)),
    ("1加1等于几？", ("2", "二")),
    ("请把“good morning”翻译成中文。", ("早上好", "早安")),
    ("天空为什么是蓝色的？", ()),
    ("请推荐一种健康的早餐。", ()),
    ("给我一个学习的小建议。", ()),
    ("为什么要多喝水？", ()),
    ("请用一句话介绍一下你自己。", ()),
    ("请写一首关于春天的短诗。", ()),
    ("请总结这句话：今天下雨了，我带了伞，所以没有淋湿。", ()),
    ("请简单解释一下什么是 KV Cache。", ()),  # the lesson's subject
]
# The lesson's own example (lesson-zh.txt: `<|user|>请给我讲一个故事`) and its English twin lead
# each list, so --quick keeps them. They are answered at the chat's own length (the default
# max_new_tokens): a small model's greedy story starts fine and falls into a loop of the same
# sentence after ~100-200 tokens, which 32 tokens (or 192: the default model's) hide.
STORY_TOKENS = SamplingParams().max_new_tokens
QUESTIONS: tuple[Question, ...] = (
    Question("请给我讲一个故事", "zh", min_length=20, max_new_tokens=STORY_TOKENS),
    Question("Tell me a short story.", "en", min_length=15, max_new_tokens=STORY_TOKENS),
    *(Question(text, "en", expected) for text, expected in _EN),
    *(Question(text, "zh", expected) for text, expected in _ZH),
)
QUICK_PER_LANGUAGE = 5
REPO_DIR = Path(__file__).resolve().parents[2]
MIGRATIONS_DIR = REPO_DIR / "playground" / "migrations"
# The migrations that ship presets (each a plain `PRESETS` list), in order.
PRESETS_MIGRATIONS = (
    MIGRATIONS_DIR / "0002_bundled_model_and_presets.py",
    MIGRATIONS_DIR / "0014_greedy_no_loops_is_the_default.py",
    MIGRATIONS_DIR / "0015_penalize_prompt_and_answer_only_no_loops.py",
)
DEFAULT_MODEL_MIGRATION = MIGRATIONS_DIR / "0011_bundled_qwen_is_the_default.py"  # MODEL_SOURCE, MODEL_DTYPE
DEFAULT_PRESET_MIGRATION = PRESETS_MIGRATIONS[-1]  # PRESET
PRESET_FIELDS = set(SamplingParams.__dataclass_fields__)


@dataclass
class Tally:
    """One cell's verdicts per language, and the first failure seen (for the table)."""

    num_coherent: dict[str, int] = field(default_factory=lambda: {"en": 0, "zh": 0})
    num_answers: dict[str, int] = field(default_factory=lambda: {"en": 0, "zh": 0})
    reasons: dict[str, int] = field(default_factory=dict)
    example_failure: str = ""

    def add(self, question: Question, reason: str, text: str, weight: int) -> None:
        self.num_answers[question.language] += weight
        self.num_coherent[question.language] += weight * (reason == "ok")
        if reason != "ok":
            self.reasons[reason] = self.reasons.get(reason, 0) + weight
            if not self.example_failure:
                self.example_failure = f"{reason}: {' '.join(text.split())[:48]}"

    def rate(self, language: str) -> float:
        return self.num_coherent[language] / self.num_answers[language] if self.num_answers[language] else 0.0


def migration_value(path: Path, name: str):
    """A module-level literal of a migration file (`PRESETS = [...]`), parsed without importing it."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path} assigns no {name}")


def shipped_presets() -> list[dict]:
    """Each preset as the last migration that ships or changes it leaves it, in first-shipped order."""
    presets: dict[str, dict] = {}
    for path in PRESETS_MIGRATIONS:
        presets.update((p["name"], dict(p)) for p in migration_value(path, "PRESETS"))
    return list(presets.values())


def default_choice() -> tuple[str, str, str]:
    """(model source, precision, preset name) that `make run` starts with, as its migrations chose."""
    source, dtype = (migration_value(DEFAULT_MODEL_MIGRATION, name) for name in ("MODEL_SOURCE", "MODEL_DTYPE"))
    return source, dtype, migration_value(DEFAULT_PRESET_MIGRATION, "PRESET")


def preset_params(preset: dict, max_new_tokens: int, seed: int) -> SamplingParams:
    fields = {k: v for k, v in preset.items() if k in PRESET_FIELDS}
    fields["max_new_tokens"] = min(max_new_tokens, fields.get("max_new_tokens", max_new_tokens))
    return SamplingParams.from_dict({**fields, "seed": seed, "use_prefix_cache": False})


def answers(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> list[str]:
    """The answer of each request, all run together in the engine's batch."""
    ids = [engine.add_request(prompt_ids, params) for prompt_ids, params in requests]
    texts: dict[int, str] = {}
    while engine.has_unfinished:
        for request_id, event in engine.step():
            if isinstance(event, Finished):
                texts[request_id] = event.text
    return [texts[i] for i in ids]


def measure(
    engine: Engine, preset: dict, questions: tuple[Question, ...], num_seeds: int, max_new_tokens: int
) -> Tally:
    """One cell: every question x seed under `preset`, judged."""
    seeds, weight = list(range(num_seeds)), 1
    probe = preset_params(preset, max_new_tokens, 0)
    if probe.is_greedy or probe.is_beam_search:
        seeds, weight = seeds[:1], num_seeds  # every seed gives the same answer
    asked = [(q, engine.prompts.build(messages=[{"role": "user", "content": q.text}]).token_ids) for q in questions]
    requests = [
        (q, ids, preset_params(preset, q.max_new_tokens or max_new_tokens, seed)) for q, ids in asked for seed in seeds
    ]
    tally = Tally()
    for (question, _, _), text in zip(requests, answers(engine, [(ids, p) for _, ids, p in requests])):
        tally.add(question, judge(text, question.expected, question.language, question.min_length).reason, text, weight)
    return tally


def pick_questions(quick: bool) -> tuple[Question, ...]:
    if not quick:
        return QUESTIONS
    return tuple(q for lang in ("en", "zh") for q in [q for q in QUESTIONS if q.language == lang][:QUICK_PER_LANGUAGE])


def decode_speed(engine: Engine) -> float:
    """Single-stream decode tok/s, greedy, 32 tokens after a short chat prompt, best of 2."""
    ids = engine.prompts.encode(
        engine.prompts.render_chat([{"role": "user", "content": "Tell me about the sea."}]).text
    )
    return max(time_ours_decode(engine, ids, 32) for _ in range(2))


def run_model(
    source: str, precisions: list[str], questions: tuple[Question, ...], args: argparse.Namespace, rows: list[dict]
) -> None:
    """Every precision x preset of one model: its rows appended to `rows` (one engine at a time)."""
    for precision in precisions:
        engine = Engine.load(EngineConfig(source=source, dtype=precision))
        speed = decode_speed(engine)
        for preset in [p for p in shipped_presets() if not args.preset or p["name"] in args.preset]:
            started = time.perf_counter()
            tally = measure(engine, preset, questions, args.seeds, args.max_new_tokens)
            row = {"model": engine.loaded.name, "source": source, "precision": precision, "preset": preset["name"]}
            rows.append({**row, "tally": tally, "decode_tok_s": speed, "seconds": time.perf_counter() - started})
            print(table_row(rows[-1]), flush=True)  # as it comes: a long run's rows survive an interruption
        del engine


TABLE_HEAD = (
    "| model | precision | preset | English coherent | Chinese coherent | failures | decode tok/s | seconds "
    "| a failure |\n|---|---|---|---|---|---|---|---|---|"
)


def table_row(r: dict) -> str:
    t = r["tally"]
    en, zh = (f"{t.num_coherent[lang]}/{t.num_answers[lang]} ({t.rate(lang):.0%})" for lang in ("en", "zh"))
    failures = ", ".join(f"{reason} {n}" for reason, n in sorted(t.reasons.items())) or "–"
    return (
        f"| {r['model']} | {r['precision']} | {r['preset']} | {en} | {zh} | {failures} | {r['decode_tok_s']:.1f} "
        f"| {r['seconds']:.0f} | {t.example_failure!r} |"
    )


def print_table(rows: list[dict]) -> None:
    print(TABLE_HEAD)
    for r in rows:
        print(table_row(r))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench quality", description=__doc__.splitlines()[0])
    quick_help = f"the first {QUICK_PER_LANGUAGE} questions of each language (the lesson's story among them)"
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--seeds", type=int, default=1, help="seeds per question of a sampled preset")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--model", action="append", help="a bundled model's source (repeatable; default: all)")
    parser.add_argument("--precision", default=None, help="comma-separated (default: float32,bfloat16,int8,int4)")
    parser.add_argument("--preset", action="append", help="a shipped preset's name (repeatable; default: all)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (a CPU shared with other work: 1)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.seeds < 1 or args.max_new_tokens < 1:
        raise ValueError(f"--seeds={args.seeds} and --max-new-tokens={args.max_new_tokens} must be at least 1")
    sources = args.model or [m.source for m in BUNDLED_MODELS]
    for source in sources:
        if bundled_model(source) is None:
            known = ", ".join(m.source for m in BUNDLED_MODELS)
            raise ValueError(f"--model={source!r} is not a bundled model ({known})")
    known_presets = [p["name"] for p in shipped_presets()]
    for name in args.preset or []:
        if name not in known_presets:
            raise ValueError(f"--preset={name!r} is not a shipped preset ({', '.join(known_presets)})")
    precisions = args.precision.split(",") if args.precision else ["float32", "bfloat16", "int8", "int4", "gguf"]
    questions = pick_questions(args.quick)
    num_en = sum(q.language == "en" for q in questions)
    print(
        f"{num_en} English + {len(questions) - num_en} Chinese questions, {args.seeds} seed(s) per sampled preset, "
        f"{args.max_new_tokens} new tokens at most, {torch.get_num_threads()} threads",
        flush=True,
    )
    rows: list[dict] = []
    print(TABLE_HEAD, flush=True)
    for source in sources:
        run_model(source, precisions, questions, args, rows)
    print()
    print_table(rows)
    print(format_keys(summary(rows)))
    return 0


def summary(rows: list[dict]) -> dict:
    """The default's numbers (as `make run` starts: its model, precision resolved on this machine,
    preset), and the best cell per language."""
    source, dtype, preset = default_choice()
    precision = resolve_precision(dtype, torch.device("cpu"), gguf_source(EngineConfig(source=source)))
    default = next((r for r in rows if (r["source"], r["precision"], r["preset"]) == (source, precision, preset)), None)
    results: dict = {}
    if default is not None:
        t = default["tally"]
        results.update(
            default_model=default["model"],
            default_precision=precision,
            default_preset=preset.replace(" ", "_"),
            default_en_coherent=t.rate("en"),
            default_zh_coherent=t.rate("zh"),
            default_decode_tok_s=default["decode_tok_s"],
        )
    for lang in ("en", "zh"):
        best = max(rows, key=lambda r: r["tally"].rate(lang))
        results[f"best_{lang}"] = f"{best['model']}/{best['precision']}/{best['preset'].replace(' ', '_')}"
        results[f"best_{lang}_coherent"] = best["tally"].rate(lang)
    return results
