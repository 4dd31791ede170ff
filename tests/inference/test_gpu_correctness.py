"""GPU-correct by construction (issue 49): the engine's random draws run where their generator lives.

Owns: the source check that every call in `inference/` that passes `generator=` also names a
`device=` (a CUDA generator cannot fill a tensor the factory puts on the CPU by default), and the
checks that seeded sampling rows run, repeat and batch on the logits' device, with the
repetition penalty, and that the sampler's read-outs on CUDA (the CPU kernels' torch fallbacks)
match the kernels': on the CPU here, on CUDA where there is one (marked `gpu`, skipped without
CUDA; `scripts/gpu_check.sh` runs them on a GPU machine).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from inference import SamplingParams
from inference.sampling.sampler import Row, Sampler, sample_rows

REPO_ROOT = Path(__file__).resolve().parents[2]
ENGINE_DIR = REPO_ROOT / "inference"
# Calls that draw into (or from) a tensor they are given: it fixes their device, so they take no
# `device=` (torch.multinomial(probs, n, generator=g) draws on probs' device).
DRAWS_ON_THEIR_INPUT = frozenset({"multinomial", "bernoulli", "poisson"})


@dataclass(frozen=True, order=True)
class Offence:
    path: str
    line: int
    call: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.call}(..., generator=...) without device="


def _call_name(call: ast.Call) -> str:
    """`torch.rand` -> "rand", `x.normal_` -> "normal_", `f` -> "f"."""
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ast.unparse(func)


def _needs_device(call: ast.Call) -> bool:
    """A call that passes a generator and makes a new tensor without saying on which device."""
    names = {k.arg for k in call.keywords}
    if "generator" not in names or "device" in names or None in names:  # None: **kwargs, unknowable
        return False
    name = _call_name(call)
    return name not in DRAWS_ON_THEIR_INPUT and not name.endswith("_")  # in-place: the tensor's device


def generator_calls_without_device(source: str, path: str) -> list[Offence]:
    """Every call in `source` that passes `generator=` to a tensor factory without `device=`."""
    tree = ast.parse(source, filename=path)
    calls = (node for node in ast.walk(tree) if isinstance(node, ast.Call) and _needs_device(node))
    return sorted(Offence(path, call.lineno, ast.unparse(call.func)) for call in calls)


def engine_offences(root: Path = ENGINE_DIR) -> list[Offence]:
    offences = []
    for path in sorted(root.rglob("*.py")):
        offences += generator_calls_without_device(path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)))
    return offences


def test_every_generator_call_in_the_engine_names_its_device() -> None:
    offences = engine_offences()
    assert not offences, "a generator's draw must name the generator's device:\n" + "\n".join(map(str, offences))


def test_the_check_finds_a_factory_without_device_and_allows_the_rest() -> None:
    source = "\n".join(
        [
            "import torch",
            "a = torch.rand(1, 1, generator=g, dtype=torch.float64)",  # line 2: the offence
            "b = torch.rand(1, 1, generator=g, device=g.device)",
            "c = torch.multinomial(probs, 1, generator=g)",
            "d = x.normal_(0.0, 1.0, generator=g)",
            "e = torch.randint(0, 9, (4,), generator=g).tolist()",  # line 6: the offence
            "f = torch.rand(3)",
        ]
    )
    offences = generator_calls_without_device(source, "x.py")
    assert [(o.line, o.call) for o in offences] == [(2, "torch.rand"), (6, "torch.randint")]
    assert str(offences[0]) == "x.py:2: torch.rand(..., generator=...) without device="


# ---- on CUDA (skipped without it) ------------------------------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
# The CPU runs check the checks themselves; the CUDA runs are what they are for.
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, needs_cuda])]
VOCAB = 49_152  # the bundled SmolLM2's


def _logits(rows: int, device: str) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(0)).to(device)


def _draw_rows(params: list[SamplingParams], logits: torch.Tensor) -> list[int]:
    rows = [Row(Sampler(p, logits.device), [1, 2, 3], None, 5) for p in params]
    samples = sample_rows(logits, rows)
    assert all(s.error is None for s in samples), [s.error for s in samples]
    return [s.token_id for s in samples]


SAMPLED = [
    SamplingParams(seed=7),  # the defaults: temperature 1, no filter
    SamplingParams(seed=8, temperature=0.8, top_k=40, top_p=0.9),
    SamplingParams(seed=9, temperature=0.7, repetition_penalty=1.3),
    SamplingParams(greedy=True, repetition_penalty=1.1),  # the default chat preset: greedy, no loops
]


@pytest.mark.parametrize("device", DEVICES)
def test_seeded_rows_sample_and_repeat(device: str) -> None:
    logits = _logits(len(SAMPLED), device)
    first = _draw_rows(SAMPLED, logits)
    assert all(0 <= t < VOCAB for t in first)
    assert _draw_rows(SAMPLED, logits) == first


@pytest.mark.parametrize("device", DEVICES)
def test_a_row_draws_the_same_alone_or_in_a_batch(device: str) -> None:
    logits = _logits(len(SAMPLED), device)
    together = _draw_rows(SAMPLED, logits)
    alone = [_draw_rows([p], logits[i : i + 1])[0] for i, p in enumerate(SAMPLED)]
    assert together == alone


@pytest.mark.parametrize("device", DEVICES)
def test_the_sampler_call_draws_on_the_logits_device(device: str) -> None:
    logits = _logits(4, device)
    context = torch.tensor([[1, 2, 3]] * 4, device=device)
    params = SamplingParams(seed=11, temperature=0.9, repetition_penalty=1.2)
    first = Sampler(params, device)(logits, context).token_ids
    assert first.device.type == device and torch.equal(first, Sampler(params, device)(logits, context).token_ids)


def _greedy_rows(device: str, n: int) -> list[Row]:
    return [Row(Sampler(SamplingParams(greedy=True), device), [1, 2], None, 10) for _ in range(n)]


@pytest.mark.gpu
@needs_cuda
def test_the_read_outs_on_cuda_match_the_cpu_kernels() -> None:
    """On CUDA the step's read-outs run the CPU kernels' torch fallbacks: same tokens, ranks,
    alternatives, and entropies within float error."""
    logits = _logits(3, "cuda")
    on_cuda, on_cpu = sample_rows(logits, _greedy_rows("cuda", 3)), sample_rows(logits.cpu(), _greedy_rows("cpu", 3))
    for a, b in zip(on_cuda, on_cpu):
        assert (a.token_id, a.rank) == (b.token_id, b.rank)
        assert [t for t, _ in a.top_raw] == [t for t, _ in b.top_raw]
        assert a.entropy == pytest.approx(b.entropy, rel=1e-4)
