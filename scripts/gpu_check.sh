#!/usr/bin/env bash
# GPU check for a lent CUDA machine, in a few minutes: the GPU-marked tests, then the quick
# engine benchmark on cuda, then a one-screen summary. Exit status: 0 only if both passed.
#
#   bash scripts/gpu_check.sh            # from the repository root
#
# Python: .venv if present; else a python3 that already has torch + transformers + pytest
# (device machines usually cannot reach a package index); else `make dev-deps`.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p test-artifacts
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-180}
BENCH_TIMEOUT_S=${BENCH_TIMEOUT_S:-120}

if [[ -x .venv/bin/python ]]; then
    PY=.venv/bin/python
elif python3 -c 'import torch, transformers, pytest' 2>/dev/null; then
    PY=python3
else
    make dev-deps || { echo "gpu_check: cannot set up Python (no .venv, no package index?)"; exit 2; }
    PY=.venv/bin/python
fi

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "(no nvidia-smi)"
"$PY" - <<'PY' || { echo "gpu_check: torch sees no CUDA device"; exit 2; }
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}")
if not torch.cuda.is_available():
    sys.exit(1)
print(f"device 0: {torch.cuda.get_device_name(0)}")
PY

echo "== pytest -m gpu (limit ${TESTS_TIMEOUT_S}s)"
timeout "$TESTS_TIMEOUT_S" "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
    --junitxml=test-artifacts/gpu-tests.xml 2>&1 | tee test-artifacts/gpu-tests.log
tests_rc=${PIPESTATUS[0]}
if [[ $tests_rc -eq 5 ]]; then echo "(no tests are marked gpu)"; tests_rc=0; fi

echo "== python -m inference.bench --device cuda --quick (limit ${BENCH_TIMEOUT_S}s)"
timeout "$BENCH_TIMEOUT_S" "$PY" -m inference.bench --device cuda --quick 2>&1 | tee test-artifacts/gpu-bench.log
bench_rc=${PIPESTATUS[0]}

echo "== summary"
echo "gpu tests: $(tail -n 1 test-artifacts/gpu-tests.log) (exit $tests_rc)"
echo "bench:     $(tail -n 1 test-artifacts/gpu-bench.log) (exit $bench_rc)"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
