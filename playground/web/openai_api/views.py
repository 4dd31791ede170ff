"""The `/v1/` endpoints: `GET /v1/models`, `POST /v1/chat/completions`, `POST /v1/completions`.

Async views (served by daphne under ASGI); a stream is a `StreamingHttpResponse` over an async
iterator of server-sent events. Owns: methods, what keeps a browser page from driving the API
(no CSRF token: instead a browser `Origin` must be an allowed one, and a body must be declared
`application/json`, which no cross-origin page can send without a CORS preflight that this API
never grants), authentication, and the choice between a JSON answer and a stream. Must not know:
the shapes of events or of answers (`run`, `shapes`).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from channels.db import database_sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from playground.model_choice import default_model, has_random_weights
from playground.models import LanguageModel
from playground.web import origin
from playground.web.openai_api import auth
from playground.web.openai_api.errors import ApiError
from playground.web.openai_api.request import ApiRequest, chat_request, completion_request, parse_body
from playground.web.openai_api.run import ApiRun

AsyncView = Callable[..., Awaitable[HttpResponse]]


def endpoint(method: str) -> Callable[[AsyncView], AsyncView]:
    """Allows `method` only, authenticates, and answers an `ApiError` in OpenAI's shape."""

    def decorate(view: AsyncView) -> AsyncView:
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args: Any) -> HttpResponse:
            try:
                if request.method != method:
                    raise ApiError(
                        f"{request.method} is not allowed here; use {method}", code="method_not_allowed", status=405
                    )
                _check_browser_rules(request)
                client = await database_sync_to_async(auth.authenticate)(request)
                return await view(request, client, *args)
            except ApiError as exc:
                return exc.response()

        return wrapper

    return decorate


def _check_browser_rules(request: HttpRequest) -> None:
    """No page of another origin may use this API with the visitor's network position (the keyless
    localhost client) or cookies: its `Origin` is refused, and a body that is not declared JSON
    (a form or a `text/plain` "simple" request, which needs no preflight) is refused too."""
    if not origin.http_origin_allowed(request):
        raise ApiError(
            f"requests from the page at {request.headers['Origin']!r} are not allowed "
            "(a browser page may call this API only from this site's own origin)",
            code="origin_not_allowed",
            status=403,
        )
    if request.method == "POST" and request.content_type != "application/json":
        got = request.content_type or "none"
        raise ApiError(
            f"the body must be JSON sent with 'Content-Type: application/json' (got {got!r})",
            code="unsupported_media_type",
            status=415,
        )


@endpoint("GET")
async def models(request: HttpRequest, client: auth.Client) -> HttpResponse:
    return JsonResponse({"object": "list", "data": await database_sync_to_async(_model_list)()})


def _model_list() -> list[dict[str, Any]]:
    """The enabled models, the one a request without a model gets first (clients often take the
    first), then the others by name, the random-weights demos last."""
    default = default_model().model
    rows = [(model, has_random_weights(model)) for model in LanguageModel.objects.filter(is_enabled=True)]
    rows.sort(key=lambda row: (row[0] != default, row[1], row[0].name))
    return [_model_entry(model, is_demo) for model, is_demo in rows]


def _model_entry(model: LanguageModel, is_demo: bool) -> dict[str, Any]:
    """OpenAI's model object; `random_weights` (and `owned_by`) mark a demo whose text is noise."""
    return {
        "id": model.name,
        "object": "model",
        "created": int(model.created_at.timestamp()),
        "owned_by": "playground-demo" if is_demo else "playground",
        "random_weights": is_demo,
    }


@endpoint("POST")
async def chat_completions(request: HttpRequest, client: auth.Client) -> HttpResponse:
    return await _answer(chat_request(parse_body(request)), client, is_chat=True)


@endpoint("POST")
async def completions(request: HttpRequest, client: auth.Client) -> HttpResponse:
    return await _answer(completion_request(parse_body(request)), client, is_chat=False)


async def _answer(api_request: ApiRequest, client: auth.Client, is_chat: bool) -> HttpResponse:
    run = ApiRun(api_request, client, is_chat)
    is_streaming = False
    try:
        await run.start()
        if api_request.stream:
            response = StreamingHttpResponse(run.stream(), content_type="text/event-stream")
            response["Cache-Control"] = "no-cache"
            response["X-Accel-Buffering"] = "no"  # a proxy in front must not buffer the events
            is_streaming = True  # the stream closes the run now
            return response
        return JsonResponse(await run.collect())
    finally:  # also when the client went away: Django then cancels the view, and this cancels the generation
        if not is_streaming:
            await run.close()
