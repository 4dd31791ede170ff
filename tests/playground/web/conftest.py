"""What the web tests share: an eager worker on the fake engine (`engine`), or on a module's tiny
real engine (`eager`, and the official `openai` client over the ASGI app: `openai_client`; the module
defines `tiny_engine`)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
import openai
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from playground import protocol
from playground.asgi import application
from playground.worker import choices
from tests.playground.fake_engine import FakeEngine
from tests.playground.sent_tasks import on_task, run_generations_on


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> FakeEngine:
    """An eager worker: the enqueued task runs the real runner on this fake engine at once (it
    answers "Hi you", and verifies one proposed token per decode step of a speculating request)."""
    fake = FakeEngine("Hi you")
    run_generations_on(monkeypatch, fake)

    def run_choices(args: tuple[list[int]], **options: Any) -> None:
        # The choices' threads publish from threads of their own: into the test's event loop, safely.
        loop = async_to_sync(_running_loop)()
        layer = get_channel_layer()

        def send(event: dict[str, Any]) -> None:
            group = protocol.group_name(event["generation_id"])
            asyncio.run_coroutine_threadsafe(layer.group_send(group, event), loop).result()

        choices.run_choices(args[0], "eager", load_engine=lambda model: fake, send=send)

    on_task(monkeypatch, "run_choices", apply_async=run_choices)
    return fake


async def _running_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch, tiny_engine) -> None:
    """Each generation runs at once on the module's tiny real engine."""
    run_generations_on(monkeypatch, tiny_engine)


@pytest.fixture
def openai_client(monkeypatch: pytest.MonkeyPatch, tiny_engine) -> openai.AsyncOpenAI:
    """The official client over the ASGI app (keyless, as from localhost); each generation runs at
    once on the module's tiny real engine."""
    run_generations_on(monkeypatch, tiny_engine)
    transport = httpx2.ASGITransport(app=application, client=("127.0.0.1", 4000))
    http = httpx2.AsyncClient(transport=transport, base_url="http://testserver")
    return openai.AsyncOpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0)
