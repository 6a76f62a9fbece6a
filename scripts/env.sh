# Environment for running vLLM on this CPU machine (sourced by test.sh and demo.sh).
#   VLLM_CPU_KVCACHE_SPACE: fixed KV budget in GiB (the VM's NUMA memory report is unreliable);
#   VLLM_HOST_IP: keep vLLM's internal sockets on loopback;
#   PYTHONPATH: the import-only torchvision shim (.ci/torchvision-shim/README.md) for Qwen3.5/3.6.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"
export VLLM_HOST_IP=127.0.0.1
export HF_HUB_OFFLINE=1
export PYTHONPATH="$ROOT/.ci/torchvision-shim${PYTHONPATH:+:$PYTHONPATH}"
VENV="${VLLM_LUCE_VENV:-$ROOT/.venv}"
export PATH="$VENV/bin:$PATH"
