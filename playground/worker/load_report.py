"""The admin's "test load": load one model on this worker, ask it one short question, and
store what happened on the model's record.

Owns: the report (load time, memory, runner, dtype, parameters, stop ids, a one-line greedy
answer) or the exact error, written to `LanguageModel.test_load_*`, with the loader's progress
(conversion bar included) stored while it runs. The engine loaded here is private to the test
and freed afterwards, its memory returned to the OS: the worker's generation engine (`engines`)
is left as it is.
Must not know: the admin's HTML, sockets.
"""

from __future__ import annotations

import gc
import logging
import resource
import time
from typing import Any

from django.utils import timezone

from playground.models import LanguageModel, LoadReportStatus

logger = logging.getLogger(__name__)

QUESTION = "What is the capital of France?"
RAW_PROMPT = "The capital of France is"  # a base model without a chat template continues text
MAX_NEW_TOKENS = 24
_PROGRESS_EVERY_S = 0.5


def run_test_load(model_id: int, worker: str) -> None:
    """Test-load the model `model_id`; the outcome lands on its record, never raises for a bad model."""
    record = LanguageModel.objects.filter(pk=model_id).first()
    if record is None:
        return
    _update(
        model_id, test_load_status=LoadReportStatus.RUNNING, test_load_error="", test_load_result={"worker": worker}
    )
    progress = _ProgressWriter(model_id, worker)
    try:
        result = _load_and_ask(record, progress)
    except Exception as exc:  # the exact error is the report
        logger.warning("test load of model %s failed: %s", model_id, exc)
        _update(
            model_id,
            test_load_status=LoadReportStatus.ERROR,
            test_load_error=f"{type(exc).__name__}: {exc}",
            test_load_result={"worker": worker, "progress": progress.lines[-20:]},
            test_load_at=timezone.now(),
        )
        return
    finally:
        _give_back_memory()
    result.update(worker=worker, progress=progress.lines[-20:])
    _update(model_id, test_load_status=LoadReportStatus.OK, test_load_result=result, test_load_at=timezone.now())


def _load_and_ask(record: LanguageModel, progress: _ProgressWriter) -> dict[str, Any]:
    import torch

    from inference.engine import Engine
    from inference.sampling_params import SamplingParams

    config = record.to_engine_config()
    rss_before = _rss_mb()
    started = time.perf_counter()
    engine = Engine.load(config, progress=progress)
    load_s = time.perf_counter() - started
    info = engine.model_info()
    if engine.loaded.chat_template:
        prompt = engine.prompts.render_chat([{"role": "user", "content": QUESTION}]).text
        prompt_ids = engine.prompts.encode(prompt)
    else:  # raw text, as the model reads it: with the BOS its tokenizer asks for
        built = engine.prompts.build(text=RAW_PROMPT)
        prompt, prompt_ids = built.text, built.token_ids
    params = SamplingParams(greedy=True, max_new_tokens=MAX_NEW_TOKENS, use_prefix_cache=False)
    started = time.perf_counter()
    finished = list(engine.generate(prompt_ids, params))[-1]
    answer_s = time.perf_counter() - started
    result = {
        "source": config.source,
        "load_s": round(load_s, 2),
        "rss_mb": round(_rss_mb(), 1),
        "rss_growth_mb": round(_rss_mb() - rss_before, 1),
        "cuda_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if engine.device.type == "cuda" else None,
        "device": info["device"],
        "dtype": info["dtype"],
        "precision": info["precision"],
        "quantization": info["quantization"],
        "runner": info["runner"],
        "architecture": info["architecture"],
        "num_params": info["num_params"],
        "weight_mb": round(info["weight_bytes"] / 2**20, 1),
        "max_context": info["max_context"],
        "eos_token_ids": list(engine.vocab.eos_token_ids),
        "eos_tokens": [engine.prompts.piece(i) for i in engine.vocab.eos_token_ids],
        "has_chat_template": info["has_chat_template"],
        "prompt": prompt,
        "answer": _one_line(finished.text),
        "finish_reason": finished.finish_reason,
        "answer_s": round(answer_s, 2),
    }
    del engine
    return result


class _ProgressWriter:
    """The loader's progress messages, kept and written to the record at most twice a second."""

    def __init__(self, model_id: int, worker: str) -> None:
        self.model_id, self.worker = model_id, worker
        self.lines: list[str] = []
        self._written_at = 0.0

    def __call__(self, message: str) -> None:
        self.lines.append(message)
        logger.info("test load of model %s: %s", self.model_id, message)
        now = time.monotonic()
        if now - self._written_at >= _PROGRESS_EVERY_S:
            self._written_at = now
            _update(self.model_id, test_load_result={"worker": self.worker, "progress": self.lines[-20:]})


def _give_back_memory() -> None:
    """The test's engine is gone: free it and return the freed heap to the OS (a test load of a
    model the worker does not serve otherwise left its whole size in the worker's RSS)."""
    from inference.models.memory import release_free_memory

    gc.collect()
    release_free_memory()


def _update(model_id: int, **fields: Any) -> None:
    # update(), not save(): the admin may be editing the record's other fields meanwhile
    LanguageModel.objects.filter(pk=model_id).update(**fields)


def _one_line(text: str) -> str:
    line = next((part.strip() for part in text.splitlines() if part.strip()), "")
    return line[:200]


def _rss_mb() -> float:
    """This process's resident memory now (Linux /proc), else its peak (getrusage)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
