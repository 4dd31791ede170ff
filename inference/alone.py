"""Requests that run alone beside the batch (beam search, the no-KV-cache mode, handoffs and
models the batched runner does not cover): each is a `generate()` iterator, advanced by one
event per engine step, so they interleave with the batch instead of blocking it.

Owns: those iterators and their cancel flags. Must not know: models, Django.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from inference.events import Event, Finished

StartAlone = Callable[[Callable[[], bool]], Iterator[Event]]  # should_cancel -> the request's events


class AloneRequests:
    def __init__(self) -> None:
        self._events: dict[int, Iterator[Event]] = {}
        self._cancelled: set[int] = set()

    def add(self, request_id: int, start: StartAlone) -> None:
        self._events[request_id] = start(lambda: request_id in self._cancelled)

    def cancel(self, request_id: int) -> bool:
        if request_id in self._events:
            self._cancelled.add(request_id)
        return request_id in self._events

    def __bool__(self) -> bool:
        return bool(self._events)

    def step(self) -> list[tuple[int, Event]]:
        events: list[tuple[int, Event]] = []
        for request_id, request_events in list(self._events.items()):
            event = next(request_events, None)
            if event is not None:
                events.append((request_id, event))
            if event is None or isinstance(event, Finished):
                del self._events[request_id]
                self._cancelled.discard(request_id)
        return events

    def clear(self) -> None:
        self._events.clear()
        self._cancelled.clear()
