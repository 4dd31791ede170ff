#!/usr/bin/env bash
# GPU check for a lent CUDA machine: one command, a few minutes, one PASS/FAIL line per step.
#   1. pytest -m gpu: every test marked `gpu` (greedy equal to transformers on CUDA, seeded
#      sampling rows on CUDA, the repetition penalty, int8/int4 on CUDA, the KV handoff's tensors);
#   2. python -m scripts.gpu_smoke: the bundled SmolLM2 on cuda through the serving path, one line
#      per path (seeded sampling, the default request and chat preset, beam search, parallel
#      sampling, the batched runner, a prefill/decode handoff, speculative decoding (a prediction,
#      prompt lookup), a grammar where the engine has one;
#      on CUDA the sampler's read-outs and the lean runner run the CPU kernels' torch fallbacks);
#   3. python -m inference.bench --device cuda --quick: the engine benchmark.
# Exit status: 0 only if every step passed; 2 when torch sees no CUDA device (nothing is run).
#
#   bash scripts/gpu_check.sh            # from anywhere; logs and the junit XML in test-artifacts/
#
# Limits in seconds (environment): TESTS_TIMEOUT_S (180), SMOKE_TIMEOUT_S (180), BENCH_TIMEOUT_S (120).
# Python: .venv if present; else a python3 that already has torch + transformers + pytest
# (device machines usually cannot reach a package index); else `make dev-deps`.
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p test-artifacts
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-180}
SMOKE_TIMEOUT_S=${SMOKE_TIMEOUT_S:-180}
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
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"
"$PY" - <<'PY' || { echo "gpu_check: SKIPPED: torch sees no CUDA device, nothing was checked"; exit 2; }
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.version.cuda}")
if not torch.cuda.is_available():
    sys.exit(1)
print(f"device 0: {torch.cuda.get_device_name(0)}")
PY

# run_step NAME LIMIT LOG COMMAND...: runs COMMAND under `timeout`, its output shown and kept in LOG;
# sets step_rc (124: over the limit).
run_step() {
    local name=$1 limit=$2 log=$3
    shift 3
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee "$log"
    step_rc=${PIPESTATUS[0]}
}

run_step "pytest -m gpu" "$TESTS_TIMEOUT_S" test-artifacts/gpu-tests.log \
    "$PY" -m pytest -m gpu -q -rA -p no:cacheprovider --junitxml=test-artifacts/gpu-tests.xml
tests_rc=$step_rc
if [[ $tests_rc -eq 5 ]]; then echo "(no tests are marked gpu)"; tests_rc=0; fi

run_step "python -m scripts.gpu_smoke" "$SMOKE_TIMEOUT_S" test-artifacts/gpu-smoke.log \
    "$PY" -m scripts.gpu_smoke --device cuda
smoke_rc=$step_rc

run_step "python -m inference.bench --device cuda --quick" "$BENCH_TIMEOUT_S" test-artifacts/gpu-bench.log \
    "$PY" -m inference.bench --device cuda --quick
bench_rc=$step_rc

verdict() { if [[ $1 -eq 0 ]]; then echo PASS; elif [[ $1 -eq 124 ]]; then echo "FAIL (over its limit)"; else echo "FAIL (exit $1)"; fi; }
echo "== summary"
echo "gpu tests: $(verdict "$tests_rc"): $(tail -n 1 test-artifacts/gpu-tests.log)"
grep -E '^(PASSED|FAILED|ERROR|SKIPPED)' test-artifacts/gpu-tests.log | sed 's/^/    /'
echo "gpu smoke: $(verdict "$smoke_rc")"
grep -E '^(PASS|FAIL) ' test-artifacts/gpu-smoke.log | sed 's/^/    /'
echo "bench:     $(verdict "$bench_rc"): $(tail -n 1 test-artifacts/gpu-bench.log)"
[[ $tests_rc -eq 0 && $smoke_rc -eq 0 && $bench_rc -eq 0 ]]
