"""Patch: bind KVFlash to Model Runner V2 once its KV cache exists (see LEDGER)."""

from __future__ import annotations

import functools

from vllm_luce.patches import ledger_signature, wrap_method

TARGET = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache"


def _make_wrapper(original):
    @functools.wraps(original)
    def initialize_kv_cache(self, kv_cache_config, is_profiling: bool = False, kv_cache_allocation_context=None):
        original(self, kv_cache_config, is_profiling, kv_cache_allocation_context)
        from vllm_luce.config import LuceConfig

        luce = LuceConfig.from_vllm_config(self.vllm_config)
        if luce.kvflash.enabled:
            from vllm_luce.kvflash.worker_v2 import bind_v2

            bind_v2(self, luce)

    return initialize_kv_cache


def apply() -> bool:
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "initialize_kv_cache", ledger_signature(TARGET), _make_wrapper)
