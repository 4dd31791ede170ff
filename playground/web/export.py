"""`GET /api/generations/<id>/steps.json` and `.csv`: every step record of a finished
generation as a download.

Owns: the two file shapes. JSON is the stored records unchanged (with the generation's id,
status, finish reason and settings around them); CSV is one row per record with a header
row, its columns the records' keys in the order they first appear, nested values (the top
alternatives, beams) as JSON text in their cell. Must not know: how steps are produced.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse

from playground.coord import liveness
from playground.models import Generation
from playground.protocol import CommandError
from playground.web.endpoints import endpoint, owned_by
from playground.web.submit import owned_generation

FORMATS = ("json", "csv")


@endpoint("GET")
def generation_steps(request: HttpRequest, generation_id: int, fmt: str) -> HttpResponse:
    if fmt not in FORMATS:
        raise CommandError("invalid_field", f"format {fmt!r} must be one of {', '.join(FORMATS)}")
    row = owned_generation(owned_by(request), generation_id)
    if row.is_active and liveness.mark_lost_if_stale(row):  # a dead worker's steps are final too
        row.refresh_from_db()
    if row.is_active:
        raise CommandError(
            "invalid_params", f"generation {generation_id} is still {row.status}: export its steps once it ends"
        )
    if fmt == "json":
        response: HttpResponse = JsonResponse(steps_document(row), json_dumps_params={"indent": 1})
    else:
        response = HttpResponse(steps_csv(row.steps), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="generation-{row.pk}-steps.{fmt}"'
    return response


def steps_document(row: Generation) -> dict[str, Any]:
    return {
        "generation_id": row.pk,
        "status": row.status,
        "finish_reason": row.finish_reason,
        "params": row.params,
        "steps": row.steps,
    }


def steps_csv(steps: list[dict[str, Any]]) -> str:
    """A header row, then one row per record; lists and dicts as compact JSON."""
    columns: dict[str, None] = {}  # an ordered set: the keys in the order they first appear
    for step in steps:
        columns.update(dict.fromkeys(step))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for step in steps:
        writer.writerow(_cell(step.get(name)) for name in columns)
    return out.getvalue()


def _cell(value: Any) -> Any:
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return "" if value is None else value
