"""The HTML pages: the chat UI at `/`, the token-probability explorer at `/explorer/` (and its
side-by-side A/B of two sampling settings at `/explorer/ab/`), the
live view of continuous batching at `/serving/`, the architecture card at `/architecture/`, the
lesson's path through all of them at `/learn/`.

Owns: which template each page renders, and which pages are an owner's (`owner_page`). The
pages are static shells; everything they show comes from the JSON API and the `/ws/generate/`
socket (docs/protocol.md), so these views must not know models, conversations or the engine.
"""

import functools
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie

from playground.web import owners


def owner_page(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A page that reads or starts the browser's generations: it has a session (made here, with
    its key rotated at every load: `owners.start_page`) and renders its page token for its
    scripts (`page_token` in the template context, a `<meta>` in base.html). Its scripts send
    mutating API calls with the `csrftoken` cookie as `X-CSRFToken`; nothing renders a form, so
    the cookie is set explicitly."""

    @ensure_csrf_cookie
    @functools.wraps(view)
    def wrapper(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        request.page_token = owners.page_token(owners.start_page(request))
        return view(request, *args, **kwargs)

    return wrapper


def _render(request: HttpRequest, template: str, page: str) -> HttpResponse:
    return render(request, template, {"page": page, "page_token": request.page_token})


@owner_page
def chat(request: HttpRequest) -> HttpResponse:
    return _render(request, "chat.html", "chat")


@owner_page
def explorer(request: HttpRequest) -> HttpResponse:
    return _render(request, "explorer.html", "explorer")


@owner_page
def explorer_ab(request: HttpRequest) -> HttpResponse:
    """One text, two sampling settings, generated side by side and aligned step by step."""
    return _render(request, "ab.html", "explorer")


def serving(request: HttpRequest) -> HttpResponse:
    """Continuous batching, live: every worker's steps from the `/ws/serving/` socket."""
    # the page says how many generations one browser may run at once (a third tab is refused)
    context = {"page": "serving", "max_concurrent": settings.PLAYGROUND_MAX_CONCURRENT_PER_CLIENT}
    return render(request, "serving.html", context)


def architecture(request: HttpRequest) -> HttpResponse:
    """What a model costs, from its config: parameters, KV cache, FLOPs (from `/api/architectures/`)."""
    return render(request, "architecture.html", {"page": "architecture"})


@owner_page
def learn(request: HttpRequest) -> HttpResponse:
    """The lesson, live: one section per chapter, each an experiment on the running model (its
    generations are the browser's: the roofline asks about one by id)."""
    return _render(request, "learn.html", "learn")
