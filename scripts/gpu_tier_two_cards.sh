#!/usr/bin/env bash
# The GPU tier on a two-card machine, TP=1 beside TP=2, in parts that each fit one 10-minute device call
# (docs/gpu.md; on 2x H200 part a took 460-480 s and part b 560 s):
#   bash scripts/gpu_tier_two_cards.sh a    # KVFlash (needles included at TP=1) and the servers, salient kernels
#   bash scripts/gpu_tier_two_cards.sh b    # DFlash and TP=1 PFlash, and the TP=2 all-features server at its own share
#   bash scripts/gpu_tier_two_cards.sh c    # the executors and TP=2 PFlash (not yet timed as one part)
# Each run of scripts/gpu_tier.sh writes to $OUT/<part>-tp<N>; record the commit with LUCE_GIT_COMMIT.
set -uo pipefail
cd "$(dirname "$0")/.."
part=${1:?part a, b or c}
OUT=${OUT:-$PWD/gpu-results}
T=${LUCE_GPU_TIMEOUT:-530}

tier() {  # name tp workers share [env...] -- pytest args
  local name=$1 tp=$2 workers=$3 share=$4
  shift 4
  local env=()
  while [ "$1" != "--" ]; do env+=("$1"); shift; done
  shift
  if [ "$tp" = 2 ]; then env+=(CUDA_VISIBLE_DEVICES=0,1 LUCE_GPU_TP=2 LUCE_TEST_FIXTURES=/tmp/fx-$name); else
    env+=(LUCE_GPU_DEVICES=2); fi
  env "${env[@]}" OUT="$OUT/$name" LUCE_GPU_WORKERS="$workers" LUCE_GPU_SHARE="$share" LUCE_GPU_TIMEOUT="$T" \
    LUCE_GPU_LOGS="/tmp/logs-$name" bash scripts/gpu_tier.sh "$@" > /dev/null 2>&1
}

case $part in
  a)
    (source .gpukit/bin/env.sh && mkdir -p "$OUT/kernels" && timeout 240 python3 -m pytest -q -p no:cacheprovider \
      -p no:benchmark tests/kernels/test_chunk_salient.py > "$OUT/kernels/pytest.log" 2>&1) &
    tier a-tp2 2 6 0.1 -- -k "((kvflash and not needle) or serve) and not all_features" &
    tier a-tp1 1 9 0.1 -- -k "kvflash or serve"
    ;;
  b)
    tier b-tp2-serve 2 1 0.3 LUCE_GPU_PORT_BASE=32000 -- -k all_features &
    tier b-tp2 2 3 0.1 -- -k "dflash and not serve" &
    tier b-tp1 1 6 0.1 -- -k "(dflash or pflash) and not serve"
    ;;
  c)
    tier c-tp2 2 4 0.1 -- -k "executors or pflash" &
    tier c-tp1 1 8 0.1 -- -k executors
    ;;
  *) echo "part a, b or c" >&2; exit 2 ;;
esac
wait
for log in "$OUT"/"$part"-*/pytest.log "$OUT"/kernels/pytest.log; do
  [ -f "$log" ] && echo "== $log" && grep -E "FAILED|ERROR|passed|failed" "$log" | tail -6
done
