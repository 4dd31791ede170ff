"""llama.cpp on the same GGUF, for the precision benchmark (optional: `llama_cpp` from
requirements-bench.txt; without it the benchmark prints our side only).

Owns: loading the file with llama-cpp-python on the CPU with the same thread count, and timing
its greedy decode (with or without a top-k distribution computed from its logits every step,
as the playground always does) and its prefill, on prompt ids we give it.
Must not know: our engine.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np


class LlamaCppBench:
    def __init__(self, llama: Any) -> None:
        self.llama = llama

    @classmethod
    def open(cls, gguf_path: Path | None, num_threads: int, n_ctx: int = 2048) -> LlamaCppBench | None:
        """None when llama_cpp is not installed or there is no GGUF file to give it."""
        try:
            from llama_cpp import Llama
        except ImportError:
            print("llama.cpp: not installed (pip install -r requirements-bench.txt), skipped")
            return None
        if gguf_path is None:
            return None
        # Its AMX kernels ("extra buffer types", weight repacking) crashed on multi-token prompts on
        # this CPU: the plain AVX512 kernels run. The switch is a model parameter Llama() does not
        # expose, so its defaults are wrapped for the load.
        import llama_cpp.llama_cpp as lib

        defaults = lib.llama_model_default_params

        def plain_kernels():
            params = defaults()
            params.use_extra_bufts = False
            return params

        lib.llama_model_default_params = plain_kernels
        try:
            llama = Llama(
                model_path=str(gguf_path),
                n_threads=num_threads,
                n_threads_batch=num_threads,
                n_ctx=n_ctx,
                verbose=False,
            )
        finally:
            lib.llama_model_default_params = defaults
        return cls(llama)

    def decode_tok_s(self, prompt_ids: list[int], num_tokens: int, top_k: int) -> float:
        """Greedy decode tokens/s after the prompt (prefill excluded); with `top_k`, a softmax and
        the top-k of the full logits every step, as our engine reports them."""
        llama = self.llama
        llama.reset()
        llama.eval(prompt_ids)
        start = time.perf_counter()
        for _ in range(num_tokens):
            logits = llama.scores[llama.n_tokens - 1]  # (vocab,) float32, a view
            token = int(np.argmax(logits))
            if top_k:
                shifted = np.exp(logits - logits[token])
                probs = shifted / shifted.sum()
                top = np.argpartition(probs, -top_k)[-top_k:]
                top[np.argsort(-probs[top])]
            llama.eval([token])
        return num_tokens / (time.perf_counter() - start)

    def prefill_tok_s(self, prompt_ids: list[int]) -> float:
        llama = self.llama
        llama.reset()
        start = time.perf_counter()
        llama.eval(prompt_ids)
        return len(prompt_ids) / (time.perf_counter() - start)
