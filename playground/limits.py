"""Server-side limits on what one client may ask for (settings `PLAYGROUND_MAX_*`).

Each check raises `CommandError` with the stable code the protocol names.
"""

from __future__ import annotations

from django.conf import settings

from inference.sampling_params import SamplingParams
from playground.coord import liveness
from playground.models import Generation
from playground.protocol import CommandError


def check_prompt_chars(num_chars: int) -> None:
    """The cheap check in the web process; the worker checks tokens exactly."""
    limit = settings.PLAYGROUND_MAX_PROMPT_CHARS
    if num_chars > limit:
        raise CommandError("prompt_too_long", f"the prompt has {num_chars} characters; the limit is {limit}")


def check_prompt_tokens(num_tokens: int, max_context: int) -> None:
    limit = settings.PLAYGROUND_MAX_PROMPT_TOKENS
    if num_tokens > limit:
        raise CommandError("prompt_too_long", f"the prompt has {num_tokens} tokens; the limit is {limit}")
    if num_tokens >= max_context:
        raise CommandError(
            "prompt_too_long",
            f"the prompt has {num_tokens} tokens and leaves no room in the model's context of {max_context}",
        )


def prompt_fits(num_tokens: int, max_context: int) -> bool:
    """What `check_prompt_tokens` accepts."""
    return num_tokens <= settings.PLAYGROUND_MAX_PROMPT_TOKENS and num_tokens < max_context


def history_budget(max_context: int, max_new_tokens: int) -> int:
    """The prompt tokens a chat that outgrew the limits is shortened to: within them, with room
    left for the answer (`max_new_tokens`, at most a quarter of the context)."""
    return min(settings.PLAYGROUND_MAX_PROMPT_TOKENS, max_context - min(max_new_tokens, max_context // 4))


def check_params(params: SamplingParams) -> None:
    limit = settings.PLAYGROUND_MAX_NEW_TOKENS
    if params.max_new_tokens > limit:
        raise CommandError(
            "invalid_params", f"max_new_tokens={params.max_new_tokens} exceeds this server's limit of {limit}"
        )


def check_concurrency(owner: str, limit: int | None = None) -> None:
    """At most `limit` (default `PLAYGROUND_MAX_CONCURRENT_PER_CLIENT`) queued or running
    generations per owner (a browser session or an API client)."""
    active = Generation.objects.filter(owner=owner, status__in=Generation.ACTIVE_STATUSES)
    liveness.reconcile(active.all())  # a dead worker's generations must not block the client forever
    limit = limit or settings.PLAYGROUND_MAX_CONCURRENT_PER_CLIENT
    num_active = active.count()  # a fresh query: reconcile may have ended some
    if num_active >= limit:
        raise CommandError(
            "too_many_generations",
            f"{num_active} generations are already running for this client; the limit is {limit}",
        )
    check_server_queue()


def check_server_queue() -> None:
    """At most `PLAYGROUND_MAX_QUEUED` generations waiting for a worker, over all clients: the
    per-client limit alone lets a crowd (or one client with many sessions) queue without end."""
    limit = settings.PLAYGROUND_MAX_QUEUED
    if not limit:
        return
    queued = Generation.objects.filter(status=Generation.Status.QUEUED)
    if queued.count() < limit:
        return
    liveness.reconcile(queued.all())  # only when full: those of a dead worker must not block everyone
    num_queued = queued.count()
    if num_queued >= limit:
        raise CommandError(
            "server_busy",
            f"the server is busy: {num_queued} requests are waiting for a worker (the limit is {limit}); "
            "try again in a moment",
        )
