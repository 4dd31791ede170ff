"""The engine loop of a worker process: one thread owns the engine and steps it; the Celery
task threads (one per generation) hand requests in and read their events out.

Owns: the only thread that touches the engine (so the engine needs no locks), the per-request
outboxes, the cancel check (a thread of its own reads the whole batch's flags every
CANCEL_POLL_S in one round trip; the engine thread only picks up what it found), the waiting
position of requests the batch has no room for yet, and the live view of each step (a
callback, throttled). Must not know: sockets, the ORM.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from inference.events import Event, Finished

if TYPE_CHECKING:
    from inference.engine import Engine
    from inference.engine_core import BatchStep
    from inference.kv.transfer import Handoff
    from inference.sampling_params import SamplingParams
    from inference.vision.images import PromptImage

logger = logging.getLogger(__name__)

PollCancelled = Callable[[list[int]], set[int]]  # generation ids -> those whose user pressed stop
CANCEL_POLL_S = 0.05  # a user's stop takes effect within this and one step
EVENT_TIMEOUT_S = 600.0  # a request that gets no event for this long: the loop is stuck
ENGINE_THREAD_NAME = "engine-loop"  # the loop thread's name for the OS (the kernels' helpers: "pg-kernels")
PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Names the calling thread for the OS (`top -H`, /proc/<pid>/task/<tid>/comm, which the stack
    benchmark reads to tell the engine's CPU from the rest of the worker's): Python 3.11 names
    only its own Thread objects. Linux; elsewhere nothing."""
    with contextlib.suppress(OSError, AttributeError):  # no libc prctl here
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


@dataclass(frozen=True)
class Waiting:
    """Not an engine event: the request waits for room in the batch (`position` 1 is next)."""

    position: int
    num_waiting: int
    waited_ms: float


class LoopObserver(Protocol):
    """Reports beside the requests' own events (the live view, metrics); called on the loop thread."""

    def on_event(self, request_id: int, event: Event) -> None: ...

    def after_step(
        self, engine: Engine, step: BatchStep | None, generation_of: dict[int, int], num_requests: int
    ) -> None: ...


class LoopFailed(RuntimeError):
    """The engine raised inside a step: every request of that step ends with this error."""


class Outbox:
    """One request's events, from the loop thread to the task thread that reads them: an iterator
    up to the request's terminal event (raising the loop's error if one comes instead), which may
    be read in several loops (`for`) one after the other.

    The reader may let them pile up until a time (`hold_until`, read on the reader's thread before
    each wait): a stream whose steps go out together then wakes once per message it sends, not
    once per step. Woken every step, eight task threads took a third of their CPU in wakeups and
    took the GIL from the engine thread between its kernels. A terminal event or an error ends a
    hold at once.
    """

    def __init__(self) -> None:
        self._items: deque[Any] = deque()
        self._ready = threading.Condition(threading.Lock())
        self._is_ended = False  # a terminal event or an error is in (or was taken)
        self._is_holding = False
        self._taken: deque[Any] = deque()  # the reader's: taken in one wake, not yet returned
        self._is_done = False  # the reader's: the terminal event (or error) was returned
        self.hold_until: Callable[[], float | None] = lambda: None  # a `time.monotonic()`; None: no hold

    def put(self, item: Any) -> None:
        """From the loop thread."""
        is_last = _ends_events(item)
        with self._ready:
            self._items.append(item)
            self._is_ended = self._is_ended or is_last
            if is_last or not self._is_holding:
                self._ready.notify()

    def __iter__(self) -> Outbox:
        return self

    def __next__(self) -> Event | Waiting:
        if self._is_done:
            raise StopIteration
        if not self._taken:
            self._taken.extend(self._take())
        item = self._taken.popleft()
        self._is_done = _ends_events(item)
        if isinstance(item, BaseException):
            raise item
        return item

    def _take(self) -> list[Any]:
        until = self.hold_until()
        with self._ready:
            if until is not None:
                self._is_holding = True
                while not self._is_ended and (remaining := until - time.monotonic()) > 0:
                    self._ready.wait(remaining)
                self._is_holding = False
            if not self._items and not self._ready.wait_for(lambda: self._items, EVENT_TIMEOUT_S):
                raise LoopFailed(f"the engine loop sent nothing for {EVENT_TIMEOUT_S:.0f} s")
            items = list(self._items)
            self._items.clear()
        return items


class ServeLoop:
    def __init__(self, engine: Engine, poll_cancelled: PollCancelled, observer: LoopObserver | None = None) -> None:
        self.engine = engine
        self.poll_cancelled = poll_cancelled
        self.observer = observer
        # (fn, its reply, is_paced): a paced command is an inspection, run one at a time with the
        # batch stepping at its pace points (`_pace`); the others are quick and run between steps.
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], queue.SimpleQueue, bool]] = queue.SimpleQueue()
        self._paced: deque[tuple[Callable[[], Any], queue.SimpleQueue, bool]] = deque()
        self._is_inspecting = False
        passes = getattr(engine, "passes", None)  # a test's fake engine may have none
        if passes is not None:
            passes.pace = self._pace
        self._outboxes: dict[int, Outbox] = {}
        self._generation_of: dict[int, int] = {}  # request id -> generation id (for the cancel check)
        self._waiting_since: dict[int, float] = {}
        self._positions: dict[int, int] = {}
        self._watched: tuple[int, ...] = ()  # the generation ids the cancel watch reads (set on the loop thread)
        self._has_watched = threading.Event()
        self._closed = False  # set by close(): both threads end, and with them the last hold on the engine
        self._found_cancelled: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()
        self._watch_thread = threading.Thread(target=self._watch_cancels, name="cancel-watch", daemon=True)
        self._watch_thread.start()

    def close(self, timeout_s: float = 5.0) -> None:
        """Ends the loop's two threads (call it once its requests are done: the model is being
        switched away from). Until closed they hold the engine, so its weights and KV pool stay
        in memory for the life of the process, whoever else forgets it."""
        self._closed = True
        self._commands.put((lambda: None, queue.SimpleQueue(), False))  # wakes an idle loop
        self._has_watched.set()  # wakes the cancel watch
        for thread in (self._thread, self._watch_thread):
            if thread is not threading.current_thread():
                thread.join(timeout_s)

    @property
    def num_requests(self) -> int:
        return len(self._outboxes)

    # ---- called from task threads ------------------------------------------------------

    def call(self, fn: Callable[[], Any]) -> Any:
        """Runs `fn` on the loop thread between two steps and returns its result (or raises).
        Every step waits for it: keep it to what only the engine's thread may do (a prompt is
        built on the caller's thread)."""
        return self._call(fn, is_paced=False)

    def call_paced(self, fn: Callable[[], Any]) -> Any:
        """Runs an inspection `fn` on the loop thread and returns its result (or raises): its
        passes (`engine.passes`) step the batch between their chunks, so it holds no one's next
        token longer than a chunk. One at a time; others wait their turn."""
        return self._call(fn, is_paced=True)

    def _call(self, fn: Callable[[], Any], is_paced: bool) -> Any:
        reply: queue.SimpleQueue = queue.SimpleQueue()
        self._commands.put((fn, reply, is_paced))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def submit(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        generation_id: int,
        handoff: Handoff | None = None,
        prefill_only: bool = False,
        images: Sequence[PromptImage] = (),
        client: str = "",
    ) -> Outbox:
        """Adds a request (a `ValueError` for bad input is raised here) and yields its events
        up to its `Finished` (or, `prefill_only`, its `HandedOff`). `client`: who asked (the
        engine shares its prefill budget fairly between clients)."""

        def add() -> list[int]:
            return [
                self.engine.add_request(
                    prompt_ids, params, handoff=handoff, prefill_only=prefill_only, images=images, client=client
                )
            ]

        return self._follow(add, [generation_id])[0]

    def submit_parallel(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        generation_ids: Sequence[int],
        images: Sequence[PromptImage] = (),
        client: str = "",
    ) -> list[Outbox]:
        """The n choices of one prompt (`n` of the OpenAI API, n = len(generation_ids)): the
        prompt is prefilled once and forked into n sequences sharing its KV blocks (the engine's
        parallel sampling); choice i samples with `choices.choice_params(params, i)` (the seed
        + i). One event iterator per choice, in order. A `ValueError` for bad input is raised
        here, and then none of them runs."""

        def add() -> list[int]:
            return self.engine.add_choices(prompt_ids, params, len(generation_ids), images=images, client=client)

        return self._follow(add, generation_ids)

    def _follow(self, add: Callable[[], list[int]], generation_ids: list[int]) -> list[Outbox]:
        """Runs `add` on the loop thread and gives each added request an outbox to read. A stop
        that came before (e.g. while a decode task waited in the queue) applies before its
        first step; it is read here, on the caller's thread, not the loop's."""
        outboxes = [Outbox() for _ in generation_ids]
        stopped = self._poll_cancelled(generation_ids)

        def register() -> None:
            for request_id, generation_id, outbox in zip(add(), generation_ids, outboxes):
                self._outboxes[request_id] = outbox
                self._generation_of[request_id] = generation_id
                self._waiting_since[request_id] = time.perf_counter()
                if generation_id in stopped:
                    self.engine.cancel(request_id)
            self._update_watched()

        self.call(register)
        return outboxes

    # ---- the loop thread ---------------------------------------------------------------

    def _run(self) -> None:
        name_os_thread(ENGINE_THREAD_NAME)
        while not self._closed:
            self._run_commands(block=not self.engine.has_unfinished and not self._paced)
            if self._paced:
                self._run_command(*self._paced.popleft())
            elif self.engine.has_unfinished:
                self._step()

    def _pace(self) -> None:
        """An inspection's pace point (on the loop thread, between two of its chunks): the quick
        commands handed in meanwhile (a new request joins the batch), then one step of the batch."""
        if not self._is_inspecting or threading.current_thread() is not self._thread:
            return
        self._run_commands(block=False)
        if self.engine.has_unfinished:
            self._step()

    def _step(self) -> None:
        """One step of the batch, its events delivered."""
        self._cancel_requested()
        generation_of = dict(self._generation_of)  # finished requests are forgotten as they are delivered
        try:
            events = self.engine.step()
        except Exception as exc:
            logger.exception("engine step failed; ending every request of this worker's batch")
            self._fail_all(LoopFailed(f"the engine failed: {type(exc).__name__}: {exc}"))
            return
        for request_id, event in events:
            if self.observer is not None:
                self.observer.on_event(request_id, event)
            self._deliver(request_id, event)
        self._report_waiting()
        if self.observer is not None:
            step = self.engine.last_batch_step if events else None
            self.observer.after_step(self.engine, step, generation_of, self.num_requests)

    def _run_commands(self, block: bool) -> None:
        """Runs every quick command handed in and queues the paced ones (`_paced`); `block`: the
        engine is idle, wait (a second) for one."""
        try:
            command = self._commands.get(timeout=1.0) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if command[2]:
                self._paced.append(command)
            else:
                self._run_command(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _run_command(self, fn: Callable[[], Any], reply: queue.SimpleQueue, is_paced: bool) -> None:
        """Runs one command; a paced one marks the loop as inspecting until it returns (a quick one
        run at its pace points leaves that mark as it is)."""
        if is_paced:
            self._is_inspecting = True
        try:
            reply.put((True, fn()))
        except Exception as exc:
            reply.put((False, exc))
        finally:
            if is_paced:
                self._is_inspecting = False

    def _cancel_requested(self) -> None:
        """Cancels the requests whose stop the cancel watch found (it never waits for Redis)."""
        cancelled: set[int] = set()
        while not self._found_cancelled.empty():
            cancelled.add(self._found_cancelled.get_nowait())
        if cancelled:
            for request_id, generation_id in self._generation_of.items():
                if generation_id in cancelled:
                    self.engine.cancel(request_id)

    def _update_watched(self) -> None:
        self._watched = tuple(self._generation_of.values())
        if self._watched:
            self._has_watched.set()

    def _watch_cancels(self) -> None:
        """The cancel watch's thread: one round trip for the whole batch every CANCEL_POLL_S while
        the loop has requests. Off the engine thread: under load that round trip waits for a
        core the forward pass is using (it was a tenth of the engine thread's time at 8 clients)."""
        while not self._closed:
            self._has_watched.wait()
            generation_ids = self._watched
            if not generation_ids:
                self._has_watched.clear()
                if self._watched:  # registered between the read and the clear
                    self._has_watched.set()
                continue
            for generation_id in self._poll_cancelled(generation_ids):
                self._found_cancelled.put(generation_id)
            time.sleep(CANCEL_POLL_S)

    def _poll_cancelled(self, generation_ids: Sequence[int]) -> set[int]:
        try:
            return self.poll_cancelled(list(generation_ids))
        except Exception:
            logger.warning("cancel check failed; trying again in %.2f s", CANCEL_POLL_S, exc_info=True)
            return set()

    def _deliver(self, request_id: int, event: Event) -> None:
        outbox = self._outboxes.get(request_id)
        if outbox is None:
            return
        self._waiting_since.pop(request_id, None)
        self._positions.pop(request_id, None)
        outbox.put(event)
        if _is_terminal(event):
            self._forget(request_id)

    def _report_waiting(self) -> None:
        """Tells each request still waiting for room in the batch its place, when it changes."""
        waiting = self.engine.waiting_request_ids()
        for position, request_id in enumerate(waiting, start=1):
            if request_id in self._waiting_since and self._positions.get(request_id) != position:
                self._positions[request_id] = position
                waited_ms = (time.perf_counter() - self._waiting_since[request_id]) * 1000
                self._outboxes[request_id].put(Waiting(position, len(waiting), waited_ms))

    def _fail_all(self, error: LoopFailed) -> None:
        self.engine.abort_all()
        for request_id in list(self._outboxes):
            self._outboxes[request_id].put(error)
            self._forget(request_id)

    def _forget(self, request_id: int) -> None:
        self._outboxes.pop(request_id, None)
        self._generation_of.pop(request_id, None)
        self._waiting_since.pop(request_id, None)
        self._positions.pop(request_id, None)
        self._update_watched()


def _is_terminal(event: Any) -> bool:
    """A request's last record: `Finished`, or `HandedOff` for a prefill-only one."""
    return isinstance(event, Finished) or getattr(event, "type", None) == "handed_off"


def _ends_events(item: Any) -> bool:
    """An outbox's last item: the request's terminal event, or the loop's error instead."""
    return isinstance(item, BaseException) or _is_terminal(item)
