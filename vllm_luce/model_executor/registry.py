"""Registers the Luce executors (``vllm_luce/architectures.py``: which architectures, and
`VLLM_LUCE_EXECUTORS`) and the DFlash drafter class with vLLM's ModelRegistry, at ``register()``."""

from __future__ import annotations

from vllm_luce.architectures import EXECUTORS, EXECUTORS_ENV, executors_mode

# Drafter architectures served by vllm-luce's drafter classes whatever VLLM_LUCE_EXECUTORS says:
# they carry DFlash's non-finite guard and adaptive verify width.
DRAFTERS: dict[str, str] = {
    "DFlashDraftModel": "vllm_luce.spec_decode.drafter:LuceDFlashQwen3ForCausalLM",
}

# What register_executors registered, one line (logged by register() and by the VllmConfig patch).
description = "not registered"


def register_drafters() -> None:
    from vllm_luce import hooks

    for architecture, class_path in DRAFTERS.items():
        hooks.register("vllm.model_executor.models:ModelRegistry.register_model", architecture, class_path)


def register_executors(environ=None) -> str:
    """Register the executors with vLLM's ModelRegistry; returns (and keeps as ``description``) a one-line
    description."""
    global description
    if executors_mode(environ) == "off":
        description = f"off ({EXECUTORS_ENV}=off: vLLM's own model classes)"
        return description
    from vllm_luce import hooks

    for architecture, class_path in EXECUTORS.items():
        hooks.register("vllm.model_executor.models:ModelRegistry.register_model", architecture, class_path)
    description = f"auto ({len(EXECUTORS)} architectures: {', '.join(EXECUTORS)})"
    return description
