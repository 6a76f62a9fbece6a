#!/usr/bin/env bash
# The GPU tier on the lent GPU machine (docs/gpu.md), from the checkout's root once the gpu-vllm kit is
# unpacked and the project installed:   bash scripts/gpu_tier.sh [pytest args...]
# Results go to $OUT (or ./gpu-results) as two files, since a device call brings back 8 at most: the pytest log and
# logs.tgz (device.txt, junit.xml and every engine's log). LUCE_GPU_TIMEOUT stops pytest with SIGINT, so that the
# failures so far and the summary are still printed; idle workers take queued tests from busy ones (worksteal).
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f .gpukit/bin/env.sh ] && source .gpukit/bin/env.sh  # the kit's vLLM: every call carries .gpukit/bin
python3 -c "import vllm" 2> /dev/null || { echo "no vllm to import: carry .gpukit/bin with this call (docs/gpu.md)" >&2; exit 2; }
RESULTS=${OUT:-$PWD/gpu-results}
mkdir -p "$RESULTS"
export LUCE_TEST_FIXTURES=${LUCE_TEST_FIXTURES:-/tmp/luce-fixtures} LUCE_GPU_LOGS=${LUCE_GPU_LOGS:-/tmp/luce-gpu-logs}
export TOKENIZERS_PARALLELISM=false
mkdir -p "$LUCE_GPU_LOGS"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
  if [ -n "${LUCE_GIT_COMMIT:-}" ]; then echo "commit $LUCE_GIT_COMMIT"  # a copy without .git
  else git log -1 --format='commit %H %cd' 2>/dev/null; fi; } | tee "$LUCE_GPU_LOGS/device.txt"
status=0
SECONDS=0
timeout -s INT -k 60 "${LUCE_GPU_TIMEOUT:-520}" python3 -m pytest tests/gpu -v -rA -p no:cacheprovider -p no:benchmark \
  --junitxml="$LUCE_GPU_LOGS/junit.xml" -n "${LUCE_GPU_WORKERS:-4}" --dist worksteal "$@" 2>&1 | tee "$RESULTS/pytest.log" \
  || status=$?
echo "tier: $SECONDS s, exit $status" | tee -a "$RESULTS/pytest.log"
tar -C "$LUCE_GPU_LOGS" -czf "$RESULTS/logs.tgz" . 2>/dev/null
exit $status
