"""Which vLLM architectures vllm-luce serves, and how they are selected.

Selection is automatic: while the plugin is installed, the architectures below are served by
the Luce executors under their upstream names, so real checkpoints need no change and every
architecture-keyed vLLM hook (config fixes, multimodal processors) still applies.
`VLLM_LUCE_EXECUTORS=off` keeps vLLM's own classes (for A/B comparisons or as an escape hatch).
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


# Drafter architectures served by vllm-luce's drafter classes whatever VLLM_LUCE_EXECUTORS says:
# they carry DFlash's non-finite guard and adaptive verify width.
DRAFTERS: dict[str, str] = {
    "DFlashDraftModel": "vllm_luce.spec_decode.drafter:LuceDFlashQwen3ForCausalLM",
}


def register_drafters() -> None:
    from vllm_luce import hooks

    for architecture, class_path in DRAFTERS.items():
        hooks.register("vllm.model_executor.models:ModelRegistry.register_model", architecture, class_path)


def register_executors(environ=None) -> str:
    """Register the executors with vLLM's ModelRegistry; returns a one-line description."""
    if executors_mode(environ) == "off":
        return f"off ({EXECUTORS_ENV}=off: vLLM's own model classes)"
    from vllm_luce import hooks

    for architecture, class_path in EXECUTORS.items():
        hooks.register("vllm.model_executor.models:ModelRegistry.register_model", architecture, class_path)
    return f"auto ({len(EXECUTORS)} architectures: {', '.join(EXECUTORS)})"
