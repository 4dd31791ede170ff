"""The n choices of one prompt (`n` of the OpenAI API) run as one unit on one worker: the prompt
is built and checked once, its n sequences go to the engine loop together
(`ServeLoop.submit_parallel`: the prompt is prefilled once and forked), and each choice
streams to its own generation's group and ends with its own terminal event.

Owns: the claim of the unit's rows (all or nothing: a unit whose client left while it waited
runs no sequence), the prompt built once for all, a thread per choice after the first (each
reads its own events), and ending every choice when the unit cannot start. Must not know:
sockets, OpenAI's shapes. Choice i's row holds the params it samples with
(`playground.choices.choice_params`), so the explorer's views of it are exact.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import db

from playground.coord import cancel, liveness, store, worker_routing
from playground.models import Generation, LanguageModel
from playground.protocol import CommandError
from playground.worker.engines import get_engine
from playground.worker.generation import GenerationRun, count_active, start_queued
from playground.worker.publisher import send_to_group

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


def run_choices(
    generation_ids: list[int],
    worker: str,
    load_engine: Callable[[LanguageModel], Engine] = get_engine,
    send: Callable[[dict[str, Any]], None] = send_to_group,
) -> None:
    """Runs the queued choices `generation_ids` (in choice order) to their ends."""
    r = store.client()
    claimed = [gid for gid in generation_ids if worker_routing.claim_delivery(r, gid, worker)]
    if not claimed:
        logger.info("the choices %s were claimed elsewhere; skipped", generation_ids)
        return
    count_active(r, worker, +len(claimed))
    try:
        with contextlib.ExitStack() as beats:  # each row beats before it reads "running"
            for gid in claimed:
                beats.enter_context(liveness.generation_heartbeat(gid))
            rows = [row for gid in claimed if (row := start_queued(gid, worker)) is not None]
            if len(rows) < len(generation_ids):
                # Some choice is no longer queued (its client left) or ran elsewhere: the rest
                # stop at once (they run no sequence; choice i's seed is its place in the unit).
                logger.info("choices %s: only %d of them could start; cancelling", generation_ids, len(rows))
                for row in rows:
                    cancel.request_cancel(row.pk)
            if rows:
                UnitRun(rows, send).execute(load_engine)
    finally:
        count_active(r, worker, -len(claimed))
    for gid in claimed:
        cancel.clear(gid)


class UnitRun:
    """The choices of one prompt: the first builds the prompt, every one streams its own sequence."""

    def __init__(self, rows: list[Generation], send: Callable[[dict[str, Any]], None]) -> None:
        self.runs = [GenerationRun(row, send) for row in rows]

    def execute(self, load_engine: Callable[[LanguageModel], Engine]) -> None:
        try:
            streams = self._start(load_engine)
        except CommandError as exc:
            self._end_all(exc)
            return
        except Exception as exc:
            logger.exception("choices %s could not start", [run.generation.pk for run in self.runs])
            self._end_all(CommandError("internal_error", f"{type(exc).__name__}: {exc}"))
            return
        threads = [
            threading.Thread(target=_stream_to_end, args=(run, events), name=f"choice {run.generation.pk}", daemon=True)
            for run, events in zip(self.runs[1:], streams[1:], strict=True)
        ]
        for thread in threads:
            thread.start()
        self.runs[0].stream_to_end(streams[0])
        for thread in threads:
            thread.join()

    def _start(self, load_engine: Callable[[LanguageModel], Engine]) -> list[Any]:
        leader = self.runs[0]

        def submit(prompt_ids: list[int], params: SamplingParams) -> list[Any]:
            try:
                return leader.loop.submit_parallel(
                    prompt_ids,
                    params,
                    [run.generation.pk for run in self.runs],
                    images=leader.images,
                    client=leader.generation.owner,
                )
            except ValueError as exc:  # the engine refused the request (e.g. it could never fit the KV pool)
                raise CommandError("invalid_params", str(exc)) from exc

        _, _, prompt_ids, streams = leader._start(load_engine, submit)
        for run in self.runs[1:]:
            run.start_like(leader, leader.prompt_record, len(prompt_ids))
        return streams

    def _end_all(self, error: CommandError) -> None:
        for run in self.runs:
            run.run_to_end(lambda error=error: _raise(error))  # each ends with the error, saved and sent


def _raise(error: CommandError) -> Any:
    raise error


def _stream_to_end(run: GenerationRun, events: Any) -> None:
    """A choice's thread: its stream, then its own database connection closed (Celery closes
    only the task thread's)."""
    try:
        run.stream_to_end(events)
    finally:
        db.connections.close_all()
