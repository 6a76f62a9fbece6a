#!/usr/bin/env bash
# The GPU tier (TP=1) on a one-card machine in three parts, one device call each (docs/gpu.md):
#   bash scripts/gpu_tier_one_card.sh a    # the executors against vLLM alone
#   bash scripts/gpu_tier_one_card.sh b    # DFlash, PFlash (not the servers), bystanders of aborts and paging
#   bash scripts/gpu_tier_one_card.sh c    # KVFlash (not the needles) and the servers
# The needles run on their own (docs/gpu.md, -k kvflash_needle). Each part runs scripts/gpu_tier.sh with 4 workers
# and writes to $OUT/<part>; LUCE_GPU_TIMEOUT (default 480 s) stops a part that outgrows its call. The parts split
# the tier's tests by their engine time in earlier runs into thirds of about the same size.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?part a, b or c}
case $part in
  a) select="executors" ;;
  b) select="(dflash or pflash or aborts) and not serve" ;;
  c) select="((kvflash and not needle) or serve) and not kvflash_dflash" ;;
  *) echo "part a, b or c" >&2; exit 2 ;;
esac
OUT="${OUT:-$PWD/gpu-results}/$part" LUCE_GPU_WORKERS=${LUCE_GPU_WORKERS:-4} LUCE_GPU_TIMEOUT=${LUCE_GPU_TIMEOUT:-480} \
  bash scripts/gpu_tier.sh -k "$select"
