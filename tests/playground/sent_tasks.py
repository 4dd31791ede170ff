"""Tests' stand-in for the broker: tasks sent by name (`dispatch.send`) go to a handler instead.

`on_task(monkeypatch, "run_generation", apply_async=fn)` calls `fn(args, queue=queue)` where
Celery would queue `playground.tasks.run_generation`; `delay=fn` calls `fn(*args)`. Several
handlers chain: a task nobody handles goes on to the previous `send_task`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from playground import dispatch


def on_task(
    monkeypatch: pytest.MonkeyPatch,
    short_name: str,
    apply_async: Callable[..., Any] | None = None,
    delay: Callable[..., Any] | None = None,
) -> None:
    previous = dispatch.app.send_task
    name = f"playground.tasks.{short_name}"

    def send_task(task_name: str, args: Any = (), queue: str | None = None, **options: Any) -> Any:
        if task_name != name:
            return previous(task_name, args=args, queue=queue, **options)
        return apply_async(tuple(args), queue=queue) if apply_async is not None else delay(*args)

    monkeypatch.setattr(dispatch.app, "send_task", send_task)


def run_generations_on(monkeypatch: pytest.MonkeyPatch, engine: Any) -> None:
    """An eager worker: each `run_generation` task runs at once, on `engine`."""
    from playground.worker import generation  # (the worker's module: not imported before a test needs it)

    on_task(
        monkeypatch,
        "run_generation",
        apply_async=lambda args, **options: generation.run_generation(
            args[0], "eager", load_engine=lambda model: engine
        ),
    )
