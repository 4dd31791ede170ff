"""The admin's "test load" through the real stack: the action (posted to the real admin by a
staff user) queues a task, a real worker loads the model and answers one question, and the
report lands on the record; a source that cannot load reports its exact error."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import django_shell

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ADMIN_ACTION = """
from django.contrib.auth import get_user_model
from django.test import Client
from playground.models import LanguageModel
user, _ = get_user_model().objects.get_or_create(
    username="e2e-admin", defaults={"is_staff": True, "is_superuser": True}
)
model = LanguageModel.objects.get(is_default=True)
client = Client(HTTP_HOST="127.0.0.1")
client.force_login(user)
response = client.post("/admin/playground/languagemodel/", {"action": "test_load", "_selected_action": [model.pk]})
print(response.status_code, model.pk)
"""

READ_REPORT = """
import json
from playground.models import LanguageModel
m = LanguageModel.objects.get(pk={pk})
print(json.dumps({{"status": m.test_load_status, "result": m.test_load_result, "error": m.test_load_error}}))
"""


def test_the_admin_test_load_runs_on_a_real_worker_and_reports_back(live_stack) -> None:
    live_stack.ensure_worker()
    status, pk = django_shell(ADMIN_ACTION, live_stack.env).split()
    assert status == "302"  # the admin redirects back to the list after queueing the action
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        report = json.loads(django_shell(READ_REPORT.format(pk=pk), live_stack.env))
        if report["status"] in ("ok", "error"):
            break
        time.sleep(1)
    assert report["status"] == "ok", report
    result = report["result"]
    assert result["worker"].startswith("e2e-gpu") and result["runner"] and result["num_params"] > 100_000_000
    assert result["answer"].strip()  # the one-line greedy answer
