#!/usr/bin/env bash
# The load-and-fault suite's gpu profile outgrows one device call (about 240 s of server start, 480 s of load, the
# drain and the idle wait), so it runs detached across two calls made back to back (the machine stays warm):
#   bash scripts/gpu_load_fault.sh start [benchmark args]   # e.g. --without cold, --seconds 100; returns at once
#   bash scripts/gpu_load_fault.sh collect                   # waits for the run to end (at most LUCE_WAIT_S, 570 s)
# (LUCE_SCALE=cpu runs the cpu profile the same way, to try the script without a GPU)
# collect copies the JSON, the server log and the progress log to $OUT; it waits on the run's process, never on a
# fixed sleep, and a run still going when it gives up is stopped with SIGTERM so that its JSON is written.
set -uo pipefail
cd "$(dirname "$0")/.."
state=${LUCE_LOAD_FAULT_STATE:-/tmp/luce-load-fault}
case ${1:?start or collect} in
  start)
    shift
    [ -f .gpukit/bin/env.sh ] && source .gpukit/bin/env.sh  # the kit's vLLM (carry .gpukit/bin with the call)
    command -v vllm > /dev/null || { echo "no vllm on PATH: carry .gpukit/bin in this call (the kit, docs/gpu.md)" >&2; exit 2; }
    rm -rf "$state" && mkdir -p "$state/work"
    LUCE_GIT_COMMIT=${LUCE_GIT_COMMIT:-$(git rev-parse --short HEAD 2> /dev/null || echo unknown)} \
      setsid nohup python3 -m benchmarks.load_fault --scale "${LUCE_SCALE:-gpu}" --json "$state/load_fault.json" \
      --workdir "$state/work" "$@" > "$state/progress.log" 2>&1 < /dev/null &
    echo $! > "$state/pid"
    echo "load_fault started (pid $(cat "$state/pid")): $*" ;;
  collect)
    pid=$(cat "$state/pid") || { echo "no run started in $state" >&2; exit 2; }
    deadline=$((SECONDS + ${LUCE_WAIT_S:-570}))
    while kill -0 "$pid" 2> /dev/null && [ $SECONDS -lt $deadline ]; do sleep 2; done
    if kill -0 "$pid" 2> /dev/null; then  # out of time: the suite writes its JSON on SIGTERM and fails ran_to_the_end
      kill -TERM "$pid"
      while kill -0 "$pid" 2> /dev/null; do sleep 1; done
    fi
    mkdir -p "${OUT:-$PWD/gpu-results}"
    cp "$state/load_fault.json" "$state/progress.log" "${OUT:-$PWD/gpu-results}/" 2> /dev/null
    cp "$state/load_fault.serve.log" "${OUT:-$PWD/gpu-results}/serve.log" 2> /dev/null || true
    grep -E "^(PASS|FAIL)|all checks passed|checks failed" "$state/progress.log" | cut -c1-400
    [ -f "$state/load_fault.json" ] ;;
  *) echo "start or collect" >&2; exit 2 ;;
esac
