"""The engine's paths on one device, one line each: what `scripts/gpu_check.sh` runs on a GPU.

Owns: loading the bundled SmolLM2 on a device and running, through the serving path, a seeded
sampled generation (twice: the same tokens), the default request (temperature 1, no seed), the
default chat preset (greedy with repetition penalty 1.1), a beam search, parallel sampling (`n`
choices forked from one prefill), the batched runner (eight mixed requests in one batch), a
prefill/decode handoff (its CUDA generator state carried over) and, where the engine has it,
constrained decoding (a grammar); a PASS/FAIL line per check, exit status 1 if any failed. On
CUDA the sampler's read-outs and the lean runner run their torch fallbacks (the fused CPU
kernels read CPU tensors only), so this covers them too.
Must not know: pytest (the `gpu`-marked tests are the other half of the check).

    python -m scripts.gpu_smoke                 # cuda
    python -m scripts.gpu_smoke --device cpu    # the same checks here, to try the script itself
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path

from inference import EngineConfig, SamplingParams
from inference.config import default_data_dir
from inference.engine import Engine
from inference.events import BeamStep, Finished, Step
from inference.models.bundled import ensure_bundled_model

PROMPT = "Tell me a short story about a lighthouse."
NEW_TOKENS = 16
SEEDED = SamplingParams(seed=7, temperature=0.8, top_p=0.95, max_new_tokens=NEW_TOKENS, ignore_eos=True)
DEFAULT_PRESET = SamplingParams(greedy=True, repetition_penalty=1.1, max_new_tokens=NEW_TOKENS, ignore_eos=True)
HAS_GRAMMAR = "grammar" in {f.name for f in fields(SamplingParams)}  # constrained decoding, where it exists
# The batched runner's requests: seeded, penalized and greedy rows side by side, twice.
MIXED = [SEEDED, DEFAULT_PRESET, replace(SEEDED, seed=8, top_k=20), replace(DEFAULT_PRESET, repetition_penalty=1.0)] * 2


@dataclass(frozen=True)
class Outcome:
    name: str
    passed: bool
    seconds: float
    detail: str

    def __str__(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name:<44} {self.seconds:6.2f} s  {self.detail}"


def run_check(name: str, check: Callable[[], str]) -> Outcome:
    """Runs one check: its detail line, or the error (traceback on stderr) as a failure."""
    started = time.perf_counter()
    try:
        detail, passed = check(), True
    except Exception as error:  # a failed check is reported, the next one still runs
        traceback.print_exc(file=sys.stderr)
        detail, passed = f"{type(error).__name__}: {error}"[:300], False
    outcome = Outcome(name, passed, time.perf_counter() - started, detail)
    print(outcome, flush=True)
    return outcome


def finished(events: Sequence) -> Finished:
    """The terminal record of a run, which must not be an error."""
    end = events[-1]
    assert isinstance(end, Finished), f"the run ended with {type(end).__name__}, not Finished"
    assert end.finish_reason != "error", f"the run failed: {end.error}"
    return end


def tokens(events: Sequence) -> list[int]:
    return [e.token_id for e in events if isinstance(e, Step)]


class Checks:
    """The checks on one loaded engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.prompt = engine.prompts.build(messages=[{"role": "user", "content": PROMPT}]).token_ids

    def generate(self, params: SamplingParams, **kwargs) -> list:
        return list(self.engine.generate(self.prompt, params, **kwargs))

    def sampled(self) -> str:
        first, again = self.generate(SEEDED), self.generate(SEEDED)
        assert tokens(first) == tokens(again), "the same seed drew other tokens"
        assert len(tokens(first)) == NEW_TOKENS
        return f"{NEW_TOKENS} tokens, the same twice: {finished(first).text[:40]!r}"

    def default_request(self) -> str:
        end = finished(self.generate(SamplingParams(max_new_tokens=NEW_TOKENS)))
        return f"{end.num_generated_tokens} tokens ({end.finish_reason})"

    def default_preset(self) -> str:
        end = finished(self.generate(DEFAULT_PRESET))
        return f"{end.num_generated_tokens} tokens: {end.text[:40]!r}"

    def beam_search(self) -> str:
        events = self.generate(SamplingParams(num_beams=4, max_new_tokens=NEW_TOKENS))
        end = finished(events)
        steps = [e for e in events if isinstance(e, BeamStep)]
        assert steps and end.num_generated_tokens > 0, "no beam step"
        return f"{len(steps)} beam steps, {end.num_generated_tokens} tokens: {end.text[:40]!r}"

    def choices(self) -> str:
        ids = self.engine.add_choices(self.prompt, SEEDED, 3)
        events = self.drain(ids)
        drawn = [tokens(events[i]) for i in ids]
        assert all(len(t) == NEW_TOKENS for t in drawn) and all(finished(events[i]) for i in ids)
        assert drawn[0] == tokens(self.generate(SEEDED)), "the first choice is not the seed's run alone"
        return f"3 choices of one prefill, {len({tuple(t) for t in drawn})} distinct"

    def batched(self) -> str:
        requests = [(self.prompt[: len(self.prompt) - i], params) for i, params in enumerate(MIXED)]
        ids = [self.engine.add_request(prompt, params) for prompt, params in requests]
        events = self.drain(ids)
        together = [tokens(events[i]) for i in ids]
        assert all(len(t) == NEW_TOKENS for t in together) and all(finished(events[i]) for i in ids), "one fell short"
        alone = [tokens(list(self.engine.generate(prompt, params))) for prompt, params in requests]
        same = sum(a == b for a, b in zip(together, alone))
        invariant = self.engine.model_info()["batch_invariant"]
        # Only the fused CPU kernels promise bitwise batch invariance; on a GPU a token may flip.
        assert same == len(ids) or not invariant, f"{same}/{len(ids)} equal to their run alone"
        return f"{len(ids)} requests in one batch, {same} equal to their run alone (batch-invariant: {invariant})"

    def grammar(self) -> str:
        end = finished(self.generate(SamplingParams(seed=5, max_new_tokens=64, grammar={"type": "json_object"})))
        assert end.text.lstrip().startswith("{"), f"not a JSON object: {end.text[:40]!r}"
        if end.finish_reason != "length":  # the grammar completed: the whole answer parses
            assert isinstance(json.loads(end.text), dict), f"not a JSON object: {end.text[:40]!r}"
        return f"{end.num_generated_tokens} tokens ({end.finish_reason}): {end.text[:40]!r}"

    def speculative(self) -> str:
        """Prompt lookup and a prediction of the answer: the same tokens (on a GPU, whose runner is
        not batch-invariant, a verified row may round differently: a near-tie may then flip)."""
        greedy = SamplingParams(greedy=True, max_new_tokens=NEW_TOKENS)
        plain = finished(self.generate(greedy))
        predicted = SamplingParams(greedy=True, max_new_tokens=NEW_TOKENS, prediction=plain.text)
        lookup = SamplingParams(greedy=True, max_new_tokens=NEW_TOKENS, speculative="prompt_lookup")
        with_prediction, with_lookup = finished(self.generate(predicted)), finished(self.generate(lookup))
        invariant = self.engine.model_info()["batch_invariant"]
        same = (with_prediction.token_ids == plain.token_ids, with_lookup.token_ids == plain.token_ids)
        assert all(same) or not invariant, f"speculation changed the answer: {same}"
        assert with_prediction.num_accepted_tokens > 0, "no token of a prediction of the answer was accepted"
        accepted = f"{with_prediction.num_accepted_tokens}/{with_prediction.num_proposed_tokens}"
        return f"prediction accepted {accepted}, same answers: {same}"

    def handoff(self) -> str:
        colocated = tokens(self.generate(SEEDED))
        blob = self.engine.export_handoff(self.engine.prefill_for_handoff(self.prompt, SEEDED))
        handoff = self.engine.import_handoff(blob)
        disaggregated = tokens(self.generate(SEEDED, handoff=handoff))
        assert disaggregated == colocated, "the decode side drew other tokens than a colocated run"  # the first too
        return f"{len(blob) / 1e6:.1f} MB blob, the decode side draws the colocated tokens"

    def drain(self, ids: Sequence[int]) -> dict[int, list]:
        events: dict[int, list] = {i: [] for i in ids}
        while self.engine.has_unfinished:
            for request_id, event in self.engine.step():
                events[request_id].append(event)
        return events

    def all(self) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("sampled generation (seed 7, top-p 0.95)", self.sampled),
            ("the default request (temperature 1, no seed)", self.default_request),
            ("default chat preset (greedy, penalty 1.1)", self.default_preset),
            ("beam search (4 beams)", self.beam_search),
            ("parallel sampling (n=3, one prefill)", self.choices),
            ("batched runner (8 mixed requests)", self.batched),
            ("prefill/decode handoff (seeded)", self.handoff),
            ("speculative decoding: a prediction, prompt lookup (greedy)", self.speculative),
        ] + ([("grammar: a JSON object (seeded)", self.grammar)] if HAS_GRAMMAR else [])


def load(device: str, dtype: str, data_dir: Path) -> Engine:
    ensure_bundled_model(data_dir, progress=print)
    return Engine.load(EngineConfig(source="bundled", device=device, dtype=dtype, data_dir=str(data_dir)), print)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--data-dir", type=Path, default=default_data_dir())
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    loaded: list[Engine] = []
    outcomes = [run_check(f"load the bundled SmolLM2 on {args.device}", lambda: _load_into(loaded, args))]
    if loaded:
        outcomes += [run_check(name, check) for name, check in Checks(loaded[0]).all()]
    passed = sum(o.passed for o in outcomes)
    print(f"gpu smoke: {passed}/{len(outcomes)} passed on {args.device}", flush=True)
    return 0 if passed == len(outcomes) else 1


def _load_into(loaded: list[Engine], args: argparse.Namespace) -> str:
    engine = load(args.device, args.dtype, args.data_dir)
    loaded.append(engine)
    info = engine.model_info()
    return f"{info.get('name')} on {engine.device}, {info.get('dtype')}, {engine.runner.name} runner"


if __name__ == "__main__":
    sys.exit(main())
