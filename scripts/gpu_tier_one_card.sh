#!/usr/bin/env bash
# The GPU tier (TP=1) on a one-card machine in three parts, one device call each (docs/gpu.md):
#   bash scripts/gpu_tier_one_card.sh a    # the executors against vLLM alone, bystanders of aborts, PFlash
#   bash scripts/gpu_tier_one_card.sh b    # DFlash (not the servers), with drafts beside paging
#   bash scripts/gpu_tier_one_card.sh c    # KVFlash (not the needles) and the servers
# The KVFlash needles run on their own (docs/gpu.md, -k kvflash_needle). Each part runs scripts/gpu_tier.sh with 4
# workers and writes to $OUT/<part>; LUCE_GPU_TIMEOUT (default 480 s) stops a part that outgrows its call. The parts
# split the tier by each test's time in the last run (its engines run side by side) into thirds of 20-25 minutes of
# test time each: about 5-7 minutes on 4 workers, run alone on the card.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?part a, b or c}
case $part in
  a) select="executors or aborts or (pflash and not serve)" ;;
  b) select="dflash and not serve and not aborts" ;;
  c) select="((kvflash and not needle) or serve) and not kvflash_dflash" ;;
  *) echo "part a, b or c" >&2; exit 2 ;;
esac
OUT="${OUT:-$PWD/gpu-results}/$part" LUCE_GPU_WORKERS=${LUCE_GPU_WORKERS:-4} LUCE_GPU_TIMEOUT=${LUCE_GPU_TIMEOUT:-480} \
  bash scripts/gpu_tier.sh -k "$select"
