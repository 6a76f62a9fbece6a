"""Patch: run the worker-side feature installs once Model Runner V2's KV cache exists (see LEDGER). The wrapper is
``initialize_kv_cache.py``'s, shared with Model Runner V1's patch."""

from __future__ import annotations

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method
from vllm_luce.patches.initialize_kv_cache import binding_wrapper

TARGET = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache"


def apply() -> bool:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "initialize_kv_cache", ledger_signature(TARGET),
                       binding_wrapper(TARGET))
