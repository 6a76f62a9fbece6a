#!/usr/bin/env bash
# The demo: set up, serve the embedded trained Qwen3.6-architecture model with vllm-luce and
# `--speculative-model dflash`, query it with the openai client, print the reply, the DFlash
# acceptance and what vllm-luce logged, stop the server. `--tiny qwen3_6`: a tiny random model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
python examples/demo.py "$@"
