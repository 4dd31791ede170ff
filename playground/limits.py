"""Server-side limits on what one client may ask for (settings `PLAYGROUND_MAX_*`).

Each check raises `CommandError` with the stable code the protocol names, and a message in the
language of the request being served (English in a worker, which serves no page).
"""

from __future__ import annotations

from django.conf import settings
from django.utils.translation import gettext

from inference.sampling_params import SamplingParams
from playground.coord import liveness
from playground.models import Generation
from playground.protocol import CommandError


def check_prompt_chars(num_chars: int) -> None:
    """The cheap check in the web process; the worker checks tokens exactly."""
    limit = settings.PLAYGROUND_MAX_PROMPT_CHARS
    if num_chars > limit:
        raise CommandError(
            "prompt_too_long",
            gettext("the prompt has %(num_chars)s characters; the limit is %(limit)s")
            % {"num_chars": num_chars, "limit": limit},
        )


def check_num_messages(num_messages: int) -> None:
    """The cheap bound on a chat's rendering (the web process, before anything is written): each
    message costs its template's role markers whatever its length, so 10,000 one-letter messages
    render to 60,000 tokens within the character limit."""
    limit = settings.PLAYGROUND_MAX_MESSAGES
    if num_messages > limit:
        raise CommandError(
            "prompt_too_long",
            gettext("messages=%(num_messages)s exceeds this server's limit of %(limit)s messages in one chat")
            % {"num_messages": num_messages, "limit": limit},
        )


def check_prompt_tokens(num_tokens: int, max_context: int) -> None:
    limit = settings.PLAYGROUND_MAX_PROMPT_TOKENS
    if num_tokens > limit:
        raise CommandError(
            "prompt_too_long",
            gettext("the prompt has %(num_tokens)s tokens; the limit is %(limit)s")
            % {"num_tokens": num_tokens, "limit": limit},
        )
    if num_tokens >= max_context:
        raise CommandError(
            "prompt_too_long",
            gettext("the prompt has %(num_tokens)s tokens and leaves no room in the model's context of %(max_context)s")
            % {"num_tokens": num_tokens, "max_context": max_context},
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
            "invalid_params",
            gettext("max_new_tokens=%(value)s exceeds this server's limit of %(limit)s")
            % {"value": params.max_new_tokens, "limit": limit},
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
            gettext("%(num_active)s generations are already running for this client; the limit is %(limit)s")
            % {"num_active": num_active, "limit": limit},
        )
    check_server_queue()


def check_server_queue(num_new: int = 1) -> None:
    """At most `PLAYGROUND_MAX_QUEUED` generations waiting for a worker, over all clients, once
    `num_new` more are queued: the per-client limit alone lets a crowd (or one client with many
    sessions) queue without end."""
    limit = settings.PLAYGROUND_MAX_QUEUED
    if not limit:
        return
    queued = Generation.objects.filter(status=Generation.Status.QUEUED)
    if queued.count() + num_new <= limit:
        return
    liveness.reconcile(queued.all())  # only when full: those of a dead worker must not block everyone
    num_queued = queued.count()
    if num_queued + num_new > limit:
        raise CommandError(
            "server_busy",
            gettext(
                "the server is busy: %(num_queued)s requests are waiting for a worker (the limit is %(limit)s); "
                "try again in a moment"
            )
            % {"num_queued": num_queued, "limit": limit},
        )


def max_api_backlog(max_concurrent: int) -> int:
    """The generations one API client may have queued or running: its concurrency, plus
    `PLAYGROUND_API_MAX_WAITING` waiting for their turn."""
    return max_concurrent + settings.PLAYGROUND_API_MAX_WAITING


def check_api_backlog(owner: str, num_new: int, max_concurrent: int) -> None:
    """An API client's generations beyond its concurrency wait for their turn
    (`web/openai_api/turns.py`) rather than fail, up to `max_api_backlog` in all; and the
    server's queue bound holds."""
    active = Generation.objects.filter(owner=owner, status__in=Generation.ACTIVE_STATUSES)
    limit = max_api_backlog(max_concurrent)
    if active.count() + num_new > limit:
        liveness.reconcile(active.all())  # a dead worker's generations must not block the client forever
        num_active = active.count()
        if num_active + num_new > limit:
            raise CommandError(
                "too_many_generations",
                f"this client has {num_active} generations queued or running and asks for {num_new} more; the limit "
                f"is {limit} ({max_concurrent} running at once, {limit - max_concurrent} waiting for their turn)",
            )
    check_server_queue(num_new)
