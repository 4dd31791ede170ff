"""`python -m inference.bench [MODE] [--quick] [...]`: one benchmark (modes: `inference.bench.MODES`)."""

from __future__ import annotations

import importlib
import sys

from inference.bench import MODES


def main(argv: list[str]) -> int:
    mode = argv[0] if argv and argv[0] in MODES else MODES[0]
    rest = argv[1:] if argv and argv[0] == mode else argv
    if argv and not argv[0].startswith("-") and argv[0] not in MODES:
        print(f"unknown mode {argv[0]!r}; choose one of {', '.join(MODES)}", file=sys.stderr)
        return 2
    return importlib.import_module(f"inference.bench.{mode}").main(rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
