"""The steps a running generation published since its row was last saved, kept in Redis so a
page that re-attaches (after a reload) gets every step: the row holds what was saved (about
once a second), this tail what was published since, the generation's group what comes next.

Owns: the tail (a sorted set by step index; its TTL refreshed by each write, so a killed
worker's tail expires), the worker's writes and trims, the web side's read, and merging the
row's steps with the tail. The order that leaves no gap: the worker writes each step here
before it publishes it, and saves the row before it trims what the row now holds; the web side
joins the group, then reads this tail, then reads the row (docs/protocol.md, `attach`).
Must not know: the ORM, sockets, the engine.
"""

from __future__ import annotations

import json
from typing import Any

from playground.coord import keys, store

TTL_S = 600  # a tail outlives any pause between two saves; a dead worker's goes on its own


def append(generation_id: int, steps: list[tuple[int, str]]) -> None:
    """Keeps `steps` (each a step's index and its record as JSON text) until the row holds them."""
    if not steps:
        return
    key = keys.recent_steps(generation_id)
    with store.client().pipeline(transaction=False) as pipe:
        pipe.zadd(key, {text: index for index, text in steps})
        pipe.expire(key, TTL_S)
        pipe.execute()


def trim_saved(generation_id: int, num_saved: int) -> None:
    """Drops the steps the row holds now (indices below `num_saved`); call after the save."""
    if num_saved > 0:
        store.client().zremrangebyscore(keys.recent_steps(generation_id), "-inf", num_saved - 1)


def delete(generation_id: int) -> None:
    """The generation ended and its row holds every step."""
    store.client().delete(keys.recent_steps(generation_id))


def read(generation_id: int) -> list[dict[str, Any]]:
    """The tail, by step index."""
    return [json.loads(member) for member in store.client().zrange(keys.recent_steps(generation_id), 0, -1)]


def merged(
    saved_text: str, saved_steps: list[dict[str, Any]], tail: list[dict[str, Any]], *, is_running: bool
) -> tuple[str, list]:
    """The row's steps extended by the tail's later steps (each index once, in order), and the
    answer's text as of those steps. A running answer's text is rebuilt from them (a token step
    adds its `text_delta`, a beam step's text is its best beam's): the row's text is saved every
    second and its steps less often, and a step is in the text before its message goes out, so
    that text may run ahead of the steps, and the live steps that follow would repeat its end.
    An ended answer's text is the row's (its steps are all saved)."""
    steps = list(saved_steps)
    for step in sorted(tail, key=lambda s: s["index"]):
        if not steps or step["index"] > steps[-1]["index"]:  # else the row has it already
            steps.append(step)
    if not is_running or not steps:
        return saved_text, steps
    text = ""
    for step in steps:
        if step.get("type") == "beam_step":
            text = step["beams"][0]["text"] if step.get("beams") else text
        else:
            text += step.get("text_delta", "")
    return text, steps
