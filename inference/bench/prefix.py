"""Prefix-cache benchmark: time to first token of a chat turn after a long history, cache on vs off.

`python -m inference.bench prefix [--quick]` (or `python -m inference.bench.prefix`).

Runs through the serving path (`Engine.add_request`/`step`: the prefix cache is the batch's
shared KV blocks).

Owns: a synthetic conversation on the bundled model, the "previous turn" that leaves its
history in the prefix cache, and the side-by-side TTFT at ~1,000 and ~2,000 history tokens.
"On" is the next turn after the history was prefilled once (as the previous turn did);
"off" is the same prompt with `use_prefix_cache=False`. Each timed run asks a different new
question, so a cached run reuses the history (plus the 2-3 tokens "Question <digit>" it may
share with an earlier question), never a whole earlier prompt. The last line printed is
`key=value` pairs (`ttft_speedup` is at ~2,000 tokens).
"""

from __future__ import annotations

import argparse
import random

from inference.bench import format_keys
from inference.config import EngineConfig
from inference.engine import Engine
from inference.events import Finished, Prefilled
from inference.sampling_params import SamplingParams

HISTORY_SIZES = {"1k": 1000, "2k": 2000}
WORDS = (
    "the keeper climbed the tower every night to light the lamp while storms rolled in "
    "from the grey sea and ships passed far away carrying letters salt timber and news "
    "of distant towns where nobody had ever heard of the small island or its light"
).split()


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
    return " ".join(words).capitalize() + "."


def conversation(num_messages: int, seed: int = 0) -> list[dict]:
    """Alternating user/assistant messages of a few sentences each (deterministic)."""
    rng = random.Random(seed)
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": " ".join(_sentence(rng) for _ in range(rng.randint(2, 5))),
        }
        for i in range(num_messages)
    ]


def history_of(engine: Engine, messages: list[dict], num_tokens: int) -> list[dict]:
    """The shortest prefix of `messages`, ending on an assistant turn, of at least num_tokens tokens."""
    for end in range(2, len(messages) + 1, 2):
        if len(chat_ids(engine, messages[:end], add_generation_prompt=False)) >= num_tokens:
            return messages[:end]
    raise ValueError(f"{len(messages)} messages hold fewer than {num_tokens} tokens")


def chat_ids(engine: Engine, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    return engine.prompts.encode(engine.prompts.render_chat(messages, add_generation_prompt=add_generation_prompt).text)


def turn_ids(engine: Engine, history: list[dict], question: str) -> list[int]:
    return chat_ids(engine, history + [{"role": "user", "content": question}])


def first_token(engine: Engine, prompt_ids: list[int], use_prefix_cache: bool) -> tuple[Prefilled, Finished]:
    params = SamplingParams(greedy=True, max_new_tokens=1, num_alternatives=0, use_prefix_cache=use_prefix_cache)
    events = list(engine.generate(prompt_ids, params))
    return events[0], events[-1]


def measure(engine: Engine, history: list[dict], repeats: int, label: str) -> dict[str, float]:
    """Best-of TTFT with and without the prefix cache (the history is already cached). A cached
    run costs one small forward pass, so it gets three tries per uncached one: its best-of is
    what is most easily spoiled by a noisy neighbour."""
    best = {True: float("inf"), False: float("inf")}
    num_cached = num_prompt = 0
    for i in range(repeats):
        for j, use_prefix_cache in enumerate((False, True, True, True)):  # interleaved: noise hits both alike
            question = f"Question {i * 4 + j}: what happened next?"
            prefilled, finished = first_token(engine, turn_ids(engine, history, question), use_prefix_cache)
            best[use_prefix_cache] = min(best[use_prefix_cache], finished.ttft_ms)
            if use_prefix_cache:
                num_cached, num_prompt = prefilled.num_cached_tokens, prefilled.num_prompt_tokens
    return {
        f"ttft_cached_ms_{label}": best[True],
        f"ttft_uncached_ms_{label}": best[False],
        f"ttft_speedup_{label}": best[False] / best[True],
        f"num_prompt_tokens_{label}": num_prompt,
        f"num_cached_tokens_{label}": num_cached,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench prefix", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat (about a minute on 2 CPU cores)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=None, help="best of N (default 3, 1 with --quick)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)

    engine = Engine.load(EngineConfig(source="bundled", device=args.device, dtype=args.dtype))
    messages = conversation(num_messages=200)
    histories = {label: history_of(engine, messages, n) for label, n in HISTORY_SIZES.items()}
    # The previous turn: prefilling the longest history caches every shorter one too (its prefix).
    longest = histories[max(HISTORY_SIZES, key=HISTORY_SIZES.get)]
    first_token(engine, chat_ids(engine, longest, add_generation_prompt=False), True)

    results: dict[str, float] = {}
    print(f"{'history':>8} {'prompt':>7} {'cached':>7} {'ttft off ms':>12} {'ttft on ms':>11} {'speedup':>8}")
    for label in HISTORY_SIZES:
        r = measure(engine, histories[label], repeats, label)
        results.update(r)
        print(
            f"{label:>8} {r[f'num_prompt_tokens_{label}']:>7} {r[f'num_cached_tokens_{label}']:>7} "
            f"{r[f'ttft_uncached_ms_{label}']:>12.1f} {r[f'ttft_cached_ms_{label}']:>11.1f} "
            f"{r[f'ttft_speedup_{label}']:>7.1f}x"
        )

    stats = engine.prefix_cache_stats()
    mb_per_1k = stats["num_bytes"] / stats["num_stored_tokens"] * 1000 / 2**20
    print(
        f"cache holds {stats['num_stored_tokens']} tokens in {stats['num_bytes'] / 2**20:.1f} MiB "
        f"({mb_per_1k:.1f} MiB per 1,000 tokens, {engine.loaded.dtype}); budget "
        f"{stats['max_bytes'] / 2**20:.0f} MiB = {int(stats['max_bytes'] / mb_per_1k / 2**20 * 1000)} tokens; "
        f"hit rate {stats['hit_rate']:.2f}"
    )
    keys = {
        "ttft_cached_ms": results["ttft_cached_ms_2k"],
        "ttft_uncached_ms": results["ttft_uncached_ms_2k"],
        "ttft_speedup": results["ttft_speedup_2k"],
        **results,
        "cache_mb_per_1k_tokens": mb_per_1k,
        "device": str(engine.device),
        "repeats": repeats,
    }
    print(format_keys(keys))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
