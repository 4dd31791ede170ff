"""The watchdog's decision (`web/following.py`), and that both followers of a generation, the
WebSocket consumer and the OpenAI API's `Follower`, take it from there rather than from a rule
of their own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from asgiref.sync import sync_to_async

from playground import dispatch, protocol
from playground.coord import liveness, worker_routing
from playground.models import Generation
from playground.web import following
from playground.web.openai_api.follow import Follower
from tests.playground.conftest import make_generation
from tests.playground.sent_tasks import on_task
from tests.playground.test_routing_wiring import sent_queues, stranded_turn

from .test_consumer import TIMEOUT_S, command, connect

ENDED = protocol.generation_error(7, "worker_lost", "gone")


def checks(monkeypatch: pytest.MonkeyPatch, reads: list[Any]) -> list[dict[str, Any] | None]:
    """What a watchdog decides over successive intervals whose database reads are `reads` (an
    event: ended; None: still running; an exception: the read failed). Nothing is re-routed."""
    answers: Iterator[Any] = iter(reads)

    def ended_event(generation_id: int) -> dict[str, Any] | None:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(liveness, "ended_event", ended_event)
    monkeypatch.setattr(dispatch, "reroute_if_stranded", lambda generation_id: False)
    watchdog = following.Watchdog(7)
    return [watchdog.check() for _ in reads]


def test_the_database_end_is_reported_after_two_ended_reads_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    assert following.NUM_ENDED_CHECKS == 2
    assert checks(monkeypatch, [None, ENDED, ENDED]) == [None, None, ENDED]
    assert checks(monkeypatch, [ENDED, None, ENDED, ENDED]) == [None, None, None, ENDED]


def test_a_failed_read_is_no_ended_read(monkeypatch: pytest.MonkeyPatch) -> None:
    assert checks(monkeypatch, [ENDED, RuntimeError("db gone"), ENDED, ENDED]) == [None, None, None, ENDED]


@pytest.mark.django_db
def test_a_real_ended_row_is_reported_on_the_second_check(owner: str) -> None:
    finished = make_generation(owner, status="finished", finish_reason="eos", text="done")
    watchdog = following.Watchdog(finished.pk)
    assert watchdog.check() is None  # the worker's own event may still be on its way
    event = watchdog.check()
    assert (event["type"], event["generation_id"]) == ("generation.finished", finished.pk)


@pytest.mark.django_db
@pytest.mark.parametrize("failure", [redis.ConnectionError("Error 111"), RuntimeError("broker bug")])
def test_a_failing_reroute_never_keeps_the_database_from_being_asked(
    owner: str, monkeypatch: pytest.MonkeyPatch, failure: Exception
) -> None:
    def reroute(generation_id: int) -> bool:
        raise failure

    monkeypatch.setattr(dispatch, "reroute_if_stranded", reroute)
    finished = make_generation(owner, status="finished", finish_reason="eos")
    watchdog = following.Watchdog(finished.pk)
    assert [watchdog.check() is not None for _ in range(2)] == [False, True]


@pytest.mark.django_db
def test_a_stranded_generation_is_rerouted_once_however_often_it_is_checked(
    owner: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    queued = stranded_turn(owner)
    sent = sent_queues(monkeypatch)
    watchdog = following.Watchdog(queued.generation_id)
    assert [watchdog.check() for _ in range(3)] == [None] * 3  # re-routed, so still waiting
    assert sent == [(queued.generation_id, worker_routing.SHARED_QUEUE)]


@pytest.mark.django_db  # each check runs through database_sync_to_async
async def test_a_stream_that_delivers_is_not_checked_until_its_events_stop(monkeypatch: pytest.MonkeyPatch) -> None:
    """A follower that gets events knows its generation is alive; asking the database about every
    open stream each second was a tenth of the web process's work with 16 of them."""
    monkeypatch.setattr(following, "WATCH_INTERVAL_S", 0.2)
    checked: list[float] = []

    def check(self: following.Watchdog) -> dict[str, Any] | None:
        checked.append(time.monotonic())  # on the database thread
        return ENDED if len(checked) >= 2 else None

    monkeypatch.setattr(following.Watchdog, "check", check)
    watchdog = following.Watchdog(7)
    watching = asyncio.ensure_future(watchdog.watch())
    streaming_until = time.monotonic() + 0.8
    while time.monotonic() < streaming_until:  # an event every 10 ms
        watchdog.saw_event()
        await asyncio.sleep(0.01)
    assert checked == [] and not watching.done()
    assert await asyncio.wait_for(watching, timeout=TIMEOUT_S) == ENDED  # events stopped: checked again
    assert len(checked) == 2 and checked[0] >= streaming_until


# ---- both followers use it -----------------------------------------------------------------


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bool]]:
    """Every watchdog check, from whichever follower: (generation id, ended reads in a row,
    reported). Three ended reads are asked for, so a follower with its own rule of two shows."""
    monkeypatch.setattr(following, "WATCH_INTERVAL_S", 0.02)
    monkeypatch.setattr(following, "NUM_ENDED_CHECKS", 3)
    seen: list[tuple[int, int, bool]] = []
    check = following.Watchdog.check

    def spied(self: following.Watchdog) -> dict[str, Any] | None:
        event = check(self)
        seen.append((self.generation_id, self.num_ended_checks, event is not None))
        return event

    monkeypatch.setattr(following.Watchdog, "check", spied)
    return seen


def assert_reported_by_the_rule(decisions: list[tuple[int, int, bool]], generation_id: int) -> None:
    mine = [(num_ended, reported) for gid, num_ended, reported in decisions if gid == generation_id]
    assert mine[-3:] == [(1, False), (2, False), (3, True)], mine
    assert [reported for _, reported in mine].count(True) == 1


@pytest.mark.django_db(transaction=True, serialized_rollback=True)
async def test_the_socket_and_the_api_stream_report_by_the_shared_rule(
    session_key: str, owner: str, monkeypatch: pytest.MonkeyPatch, decisions: list[tuple[int, int, bool]]
) -> None:
    on_task(monkeypatch, "run_generation", apply_async=lambda args, **options: None)  # no worker
    ws = connect(session_key)
    assert (await ws.connect(timeout=TIMEOUT_S))[0]
    queued = await command(ws, "complete", text="hi")
    follower = Follower((await sync_to_async(make_generation)(owner)).pk)
    await follower.join()
    # Both rows end without a terminal event reaching anyone (a worker whose event got lost).
    ids = [queued["generation_id"], follower.generation_id]
    await sync_to_async(Generation.objects.filter(pk__in=ids).update)(status="finished", finish_reason="eos")

    socket_end = await ws.receive_json_from(timeout=TIMEOUT_S)
    stream_end = await asyncio.wait_for(anext(aiter(follower.events())), TIMEOUT_S)
    assert [socket_end["type"], stream_end["type"]] == ["generation.finished"] * 2
    assert_reported_by_the_rule(decisions, queued["generation_id"])
    assert_reported_by_the_rule(decisions, follower.generation_id)
    assert await ws.receive_nothing(timeout=0.1)
    await follower.close()
    await ws.disconnect()
