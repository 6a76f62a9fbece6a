#!/usr/bin/env bash
# The GPU tier on the lent GPU machine (docs/gpu.md), from the checkout's root once the gpu-vllm kit is
# unpacked and the project installed:   bash scripts/gpu_tier.sh [pytest args...]
# Results go to $OUT (or ./gpu-results): junit.xml, the pytest log and every engine's log (logs.tgz).
set -uo pipefail
cd "$(dirname "$0")/.."
source .gpukit/bin/env.sh
RESULTS=${OUT:-$PWD/gpu-results}
mkdir -p "$RESULTS"
export LUCE_TEST_FIXTURES=${LUCE_TEST_FIXTURES:-/tmp/luce-fixtures} LUCE_GPU_LOGS=${LUCE_GPU_LOGS:-/tmp/luce-gpu-logs}
export TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$RESULTS/device.txt"
python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" | tee -a "$RESULTS/device.txt"
if [ -n "${LUCE_GIT_COMMIT:-}" ]; then echo "commit $LUCE_GIT_COMMIT" | tee -a "$RESULTS/device.txt"  # a copy without .git
else git log -1 --format='commit %H %cd' 2>/dev/null | tee -a "$RESULTS/device.txt"; fi
status=0
timeout "${LUCE_GPU_TIMEOUT:-520}" python3 -m pytest tests/gpu -v -rA -p no:cacheprovider -p no:benchmark --junitxml="$RESULTS/junit.xml" \
  -n "${LUCE_GPU_WORKERS:-4}" "$@" 2>&1 | tee "$RESULTS/pytest.log" || status=$?
tar -C "$LUCE_GPU_LOGS" -czf "$RESULTS/logs.tgz" . 2>/dev/null
exit $status
