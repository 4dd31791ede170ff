"""The one contract `EngineCore` drives every request through (`inference.batch_request`):
a sampled request and a beam search both implement all of it, and the core never asks which
kind a request is."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from inference.batch_request import BatchRequest
from inference.beams import BeamRequest
from inference.requests import Request

ENGINE_CORE = Path(__file__).resolve().parents[2] / "inference" / "engine_core.py"


def contract_members() -> set[str]:
    names = set(BatchRequest.__annotations__)
    names |= {name for name in vars(BatchRequest) if not name.startswith("_")}
    return names


@pytest.mark.parametrize("kind", [Request, BeamRequest], ids=lambda kind: kind.__name__)
def test_each_request_kind_implements_the_whole_contract(kind: type) -> None:
    provided = {f.name for f in dataclasses.fields(kind)} | {name for name in dir(kind) if not name.startswith("_")}
    assert contract_members() - provided == set()
    assert {"seqs", "sampling_rows", "take_logits", "kv_bytes", "end", "forks"} <= contract_members()


def test_the_engine_core_has_no_branch_on_a_request_kind() -> None:
    calls = [
        ast.unparse(node)
        for node in ast.walk(ast.parse(ENGINE_CORE.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "isinstance"
        and {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} & {"Request", "BeamRequest"}
    ]
    assert calls == []
