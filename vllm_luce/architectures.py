"""Which vLLM architectures the Luce executors serve, and how they are selected.

Selection is automatic: while the plugin is installed, the architectures below are served by
the Luce executors under their upstream names, so real checkpoints need no change and every
architecture-keyed vLLM hook (config fixes, multimodal processors) still applies.
`VLLM_LUCE_EXECUTORS=off` keeps vLLM's own classes (for A/B comparisons or as an escape hatch).
``model_executor/registry.py`` registers them with vLLM; KVFlash's install refuses any other architecture.
"""

from __future__ import annotations

import os

_MODELS = "vllm_luce.model_executor.models"

# upstream architecture -> "module:Class" of its Luce executor (lazy: imported only when used).
EXECUTORS: dict[str, str] = {
    "Qwen3_5ForCausalLM": f"{_MODELS}.qwen3_5:LuceQwen3_5ForCausalLM",
    "Qwen3_5MoeForCausalLM": f"{_MODELS}.qwen3_5:LuceQwen3_5MoeForCausalLM",
    "Qwen3_5ForConditionalGeneration": f"{_MODELS}.qwen3_5:LuceQwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForConditionalGeneration": f"{_MODELS}.qwen3_5:LuceQwen3_5MoeForConditionalGeneration",
    "Gemma4ForCausalLM": f"{_MODELS}.gemma4:LuceGemma4ForCausalLM",
    "Gemma4ForConditionalGeneration": f"{_MODELS}.gemma4:LuceGemma4ForConditionalGeneration",
    "LagunaForCausalLM": f"{_MODELS}.laguna:LuceLagunaForCausalLM",
}

EXECUTORS_ENV = "VLLM_LUCE_EXECUTORS"
MODES = ("auto", "off")


def executors_mode(environ=None) -> str:
    environ = os.environ if environ is None else environ
    mode = environ.get(EXECUTORS_ENV, "auto").strip().lower()
    if mode not in MODES:
        raise ValueError(f"{EXECUTORS_ENV}={environ[EXECUTORS_ENV]!r}; expected one of {', '.join(MODES)}")
    return mode
