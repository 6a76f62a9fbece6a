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
echo "== tier 2: Triton kernels under the interpreter (TRITON_INTERPRET=1)"
TRITON_INTERPRET=1 python -m pytest tests/kernels -q "$@"
echo "== tier 3: end to end through real vLLM (in-process LLM, vllm serve + openai client)"
python -m pytest tests/e2e -q --durations=25 "$@"  # the slowest, for CI time (docs/ci.md)
