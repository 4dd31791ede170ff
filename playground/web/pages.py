"""The HTML pages: the chat UI at `/`, the token-probability explorer at `/explorer/` (and its
side-by-side A/B of two sampling settings at `/explorer/ab/`), the
live view of continuous batching at `/serving/`, the architecture card at `/architecture/`, the
lesson's path through all of them at `/learn/`.

Owns: which template each page renders. The pages are static shells; everything they show
comes from the JSON API and the `/ws/generate/` socket (docs/protocol.md), so these views
must not know models, conversations or the engine.
"""

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import ensure_csrf_cookie


# The page's scripts send mutating API calls with the `csrftoken` cookie as `X-CSRFToken`;
# nothing in the page renders a form, so the cookie must be set explicitly.
@ensure_csrf_cookie
def chat(request: HttpRequest) -> HttpResponse:
    return render(request, "chat.html", {"page": "chat"})


@ensure_csrf_cookie
def explorer(request: HttpRequest) -> HttpResponse:
    return render(request, "explorer.html", {"page": "explorer"})


@ensure_csrf_cookie
def explorer_ab(request: HttpRequest) -> HttpResponse:
    """One text, two sampling settings, generated side by side and aligned step by step."""
    return render(request, "ab.html", {"page": "explorer"})


def serving(request: HttpRequest) -> HttpResponse:
    """Continuous batching, live: every worker's steps from the `/ws/serving/` socket."""
    # the page says how many generations one browser may run at once (a third tab is refused)
    context = {"page": "serving", "max_concurrent": settings.PLAYGROUND_MAX_CONCURRENT_PER_CLIENT}
    return render(request, "serving.html", context)


def architecture(request: HttpRequest) -> HttpResponse:
    """What a model costs, from its config: parameters, KV cache, FLOPs (from `/api/architectures/`)."""
    return render(request, "architecture.html", {"page": "architecture"})


@ensure_csrf_cookie
def learn(request: HttpRequest) -> HttpResponse:
    """The lesson, live: one section per chapter, each an experiment on the running model."""
    return render(request, "learn.html", {"page": "learn"})
