"""`python -m inference.bench [MODE] [--quick] [...]`: one benchmark (modes: `inference.bench.MODES`)."""

from __future__ import annotations

import importlib
import os
import sys

from inference.bench import MODES

# The modes whose engine runs on this process's main thread (the worker runs it on a thread of
# its own) beside no llama.cpp of the same process (`precision` hosts llama_cpp, which runs on
# OpenMP and wants its threads to spin).
MAIN_THREAD_MODES = frozenset(MODES) - {"precision"}


def main(argv: list[str]) -> int:
    mode = argv[0] if argv and argv[0] in MODES else MODES[0]
    rest = argv[1:] if argv and argv[0] == mode else argv
    if argv and not argv[0].startswith("-") and argv[0] not in MODES:
        print(f"unknown mode {argv[0]!r}; choose one of {', '.join(MODES)}", file=sys.stderr)
        return 2
    if mode in MAIN_THREAD_MODES:
        quiet_openmp_workers()
    return importlib.import_module(f"inference.bench.{mode}").main(rest)


def quiet_openmp_workers() -> None:
    """torch's OpenMP workers sleep between ops (before torch loads: OpenMP reads this once).
    The CPU kernels have a thread pool of their own; with the engine on the main thread, torch's
    workers spinning after each op took the cores from it (2-core EPYC, SmolLM2 bfloat16: one
    stream 53 -> 79 tok/s, 8 int4 streams 153 -> 291). On the worker's engine thread they did not
    (~10% slower asleep), so the product keeps OpenMP's default. A value the user set wins; the
    processes this one starts (the stack, llama-server) get it as it was (`bench.starting_env`)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
