"""Speculative decoding benchmark: the same answers, in less time where proposals hold.

`python -m inference.bench speculative [--quick] [--model bundled:qwen2.5-coder-0.5b-instruct] [--dtype D]`

Measured side by side in one process, on the model users get (its `auto` precision):
- `greedy_identical`: 1 when every greedy answer (code edits, the lesson's questions in Chinese and
  English) is token for token the same with prompt lookup and with a prediction as without;
- `sampled_tv`: at temperature 1, the total variation distance between the token frequencies of
  positions 2-4 without speculation (seeds 0..N-1) and with it (seeds N..2N-1: independent draws,
  so the figure is sampling noise when the distributions are equal; each draw's positions 2-4 are
  verified from proposals, 3 per pass), averaged over the positions; `sampled_same_seed_identical`:
  the share of draws whose tokens with speculation equal those without for the same seed;
- `speedup_edit`: one stream, code edits with prompt lookup (chosen per pass), wall time without
  over with; `speedup_prediction`: the same with the original code as `prediction`;
- `speedup_batch_8`: 8 streams at once (half code edits, half open questions), aggregate tokens/s
  with prompt lookup over without: a full batch must not be slower;
- `acceptance_rate`: accepted over proposed tokens in the one-stream edits.
Each timed pair runs interleaved, best of `--repeats`, on a quiet machine.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter

from inference.bench import format_keys
from inference.bench.batch import QUESTIONS, load
from inference.bench.quality import _EN, _ZH
from inference.engine import Engine
from inference.events import Finished, Step
from inference.sampling_params import SamplingParams

CODE = [
    """def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax


def average_price(items):
    if not items:
        return 0
    total = sum(item.price for item in items)
    return total / len(items)
""",
    """class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from an empty stack")
        return self.items.pop()

    def size(self):
        return len(self.items)
""",
    """def read_scores(path):
    scores = {}
    with open(path) as f:
        for line in f:
            name, score = line.strip().split(",")
            scores[name] = int(score)
    return scores


def best_student(scores):
    return max(scores, key=scores.get)
""",
]
EDITS = [
    "Rename the variable `subtotal` to `net_total`.",
    "Rename the method `size` to `__len__`.",
    "Rename the parameter `path` to `filename`.",
]
SAMPLED_PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog."


def edit_chat(i: int) -> list[dict[str, str]]:
    task = f"{EDITS[i]} Reply with the full code only.\n\n```python\n{CODE[i]}```"
    return [{"role": "user", "content": task}]


def encode(engine: Engine, chat: list[dict[str, str]]) -> list[int]:
    return engine.prompts.encode(engine.prompts.render_chat(chat).text)


def run_all(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> tuple[list[Finished], float, int]:
    """Every request at once through the batch: their Finished records, the wall time, the tokens."""
    started = time.perf_counter()
    ids = [engine.add_request(prompt_ids, params) for prompt_ids, params in requests]
    finished: dict[int, Finished] = {}
    num_tokens = 0
    while engine.has_unfinished:
        for request_id, event in engine.step():
            num_tokens += isinstance(event, Step)
            if isinstance(event, Finished):
                finished[request_id] = event
    return [finished[i] for i in ids], time.perf_counter() - started, num_tokens


def greedy_identical(engine: Engine, max_new_tokens: int, quick: bool) -> int:
    greedy = SamplingParams(greedy=True, max_new_tokens=max_new_tokens, num_alternatives=20, use_prefix_cache=False)
    questions = [q for q, _ in (_ZH[:3] + _EN[:3] if quick else _ZH + _EN)]
    chats = [edit_chat(i) for i in range(len(CODE))] + [[{"role": "user", "content": q}] for q in questions]
    prompts = [encode(engine, chat) for chat in chats]
    plain, _, _ = run_all(engine, [(p, greedy) for p in prompts])
    lookup = SamplingParams(**{**greedy.to_dict(), "speculative": "prompt_lookup"})
    with_lookup, _, _ = run_all(engine, [(p, lookup) for p in prompts])
    predicted = [SamplingParams(**{**greedy.to_dict(), "prediction": f.text}) for f in plain]
    with_prediction, _, _ = run_all(engine, list(zip(prompts, predicted)))
    same = all(a.token_ids == b.token_ids == c.token_ids for a, b, c in zip(plain, with_lookup, with_prediction))
    return int(same)


def sampled(engine: Engine, num_draws: int) -> tuple[float, float]:
    """(TV distance of positions 2-4 between independent draws with and without, share of
    same-seed draws that are identical)."""
    prompt = encode(engine, [{"role": "user", "content": SAMPLED_PROMPT}])
    base = {"temperature": 1.0, "max_new_tokens": 4, "num_alternatives": 0}
    speculative = {**base, "speculative": "prompt_lookup", "num_speculative_tokens": 3}
    batch = 64  # choices sharing one prefill (seeds seed, seed + 1, ...): the draws are independent

    def draws(fields: dict, seeds: range) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for start in range(seeds.start, seeds.stop, batch):
            num_choices = min(batch, seeds.stop - start)
            ids = engine.add_choices(prompt, SamplingParams(**fields, seed=start), num_choices)
            done: dict[int, tuple[int, ...]] = {}
            while engine.has_unfinished:
                done.update((i, e.token_ids) for i, e in engine.step() if isinstance(e, Finished))
            out += [done[i] for i in ids]
        return out

    plain = draws(base, range(num_draws))
    spec = draws(speculative, range(num_draws, 2 * num_draws))
    tv = sum(_tv([d[p] for d in plain if len(d) > p], [d[p] for d in spec if len(d) > p]) for p in (1, 2, 3)) / 3
    num_same = num_draws // 4
    same_seed = draws(speculative, range(num_same))
    identical = sum(a == b for a, b in zip(plain[:num_same], same_seed)) / num_same
    return tv, identical


def _tv(a: list[int], b: list[int]) -> float:
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[t] / len(a) - cb[t] / len(b)) for t in set(ca) | set(cb))


def speedups(engine: Engine, max_new_tokens: int, repeats: int) -> dict[str, float]:
    greedy = {"greedy": True, "max_new_tokens": max_new_tokens, "num_alternatives": 20, "use_prefix_cache": False}
    edits = [encode(engine, edit_chat(i)) for i in range(len(CODE))]
    best = {"plain": 1e9, "lookup": 1e9, "prediction": 1e9, "batch_plain": 0.0, "batch_lookup": 0.0}
    accepted = proposed = 0
    mixed = edits + [encode(engine, [{"role": "user", "content": q}]) for q in QUESTIONS[:5]]
    mixed = mixed[:8]
    for _ in range(repeats):
        times = {"plain": 0.0, "lookup": 0.0, "prediction": 0.0}
        for i, prompt in enumerate(edits):
            for arm, extra in (
                ("plain", {}),
                ("lookup", {"speculative": "prompt_lookup"}),
                ("prediction", {"prediction": CODE[i]}),
            ):
                done, seconds, _ = run_all(engine, [(prompt, SamplingParams(**greedy, **extra))])
                times[arm] += seconds
                if arm == "lookup":
                    accepted += done[0].num_accepted_tokens
                    proposed += done[0].num_proposed_tokens
        for arm in times:
            best[arm] = min(best[arm], times[arm])
        for arm, extra in (("batch_plain", {}), ("batch_lookup", {"speculative": "prompt_lookup"})):
            _, seconds, num_tokens = run_all(engine, [(p, SamplingParams(**greedy, **extra)) for p in mixed])
            best[arm] = max(best[arm], num_tokens / seconds)
    return {
        "speedup_edit": best["plain"] / best["lookup"],
        "speedup_prediction": best["plain"] / best["prediction"],
        "speedup_batch_8": best["batch_lookup"] / best["batch_plain"],
        "acceptance_rate": accepted / max(proposed, 1),
        "batch_8_tok_s": best["batch_lookup"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inference.bench speculative", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer questions, 2,000 draws, 2 repeats")
    parser.add_argument("--model", default="bundled:qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--repeats", type=int, default=None)
    args = parser.parse_args(argv)
    engine = load(args.model, args.device, args.dtype, 64)
    max_new_tokens = 96 if args.quick else 192
    print(f"model={engine.info.name} precision={engine.loaded.precision} device={engine.device}")
    results: dict[str, float | int | str] = {"greedy_identical": greedy_identical(engine, max_new_tokens, args.quick)}
    print(format_keys(results), flush=True)
    tv, identical = sampled(engine, 2000 if args.quick else 4000)
    results.update(sampled_tv=tv, sampled_same_seed_identical=identical)
    print(format_keys(results), flush=True)
    results.update(speedups(engine, max_new_tokens, args.repeats or (2 if args.quick else 3)))
    print(format_keys(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
