#!/usr/bin/env bash
# The demo: set up, build the embedded tiny Qwen3.6-architecture model, serve it with vllm-luce,
# query it with the openai client, print the reply and the active features, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
python examples/demo.py "$@"
