#!/usr/bin/env bash
# The test command (README, and all that .ci/run does): set up, then three tiers of pytest.
# Any failure, and any tier that runs zero tests (pytest exit 5), fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
export LUCE_TEST_FIXTURES="${LUCE_TEST_FIXTURES:-$(mktemp -d)/fixtures}"

echo "== tier 1: unit tests (pure cores, config, registry, patches)"
python -m pytest tests -q --ignore=tests/kernels --ignore=tests/e2e "$@"

# Tier 2 runs beside tier 3: the interpreter is one Python thread, and tier 3 spends most of its time in
# single-threaded vLLM startups, so on 2 cores the pair takes about tier 3's time (docs/ci.md). Tier 2
# reads only checked-in assets, never tier 3's fixtures.
kernels_log="$(mktemp)"
echo "== tier 2: Triton kernels under the interpreter (TRITON_INTERPRET=1), beside tier 3; output below"
TRITON_INTERPRET=1 python -m pytest tests/kernels -q "$@" > "$kernels_log" 2>&1 &
kernels_pid=$!
stop_kernels() { if kill -0 "$kernels_pid" 2> /dev/null; then kill "$kernels_pid"; fi; }
trap stop_kernels EXIT  # an interrupted run leaves no tier behind

echo "== tier 3: end to end through real vLLM (in-process LLM, vllm serve + openai client)"
e2e_status=0
python -m pytest tests/e2e -q --durations=25 "$@" || e2e_status=$?  # the slowest, for CI time (docs/ci.md)
kernels_status=0
wait "$kernels_pid" || kernels_status=$?
echo "== tier 2 output"
cat "$kernels_log"
echo "== tier 2 exit $kernels_status, tier 3 exit $e2e_status"
[ "$kernels_status" -eq 0 ] && [ "$e2e_status" -eq 0 ]
