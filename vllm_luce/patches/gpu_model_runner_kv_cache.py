"""Patch: bind KVFlash to V1's model runner once its KV cache exists (see LEDGER).
``binding_wrapper`` also serves Model Runner V2 (``gpu_v2_model_runner_kv_cache``)."""

from __future__ import annotations

import functools
import importlib

from vllm_luce.patches import ledger_signature, wrap_method

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache"


def binding_wrapper(bind: str):
    """A wrapper factory for initialize_kv_cache that, after vLLM's code, calls ``bind(runner, luce)``
    with luce.kvflash on (``bind`` is "module:function", imported only then) and, with luce.pflash on,
    loads the PFlash drafter onto the runner (pflash.worker.bind)."""

    def make(original):
        @functools.wraps(original)
        def initialize_kv_cache(self, kv_cache_config, *args, **kwargs):  # the other parameters vary by series
            original(self, kv_cache_config, *args, **kwargs)
            from vllm_luce.config import LuceConfig

            luce = LuceConfig.from_vllm_config(self.vllm_config)
            if luce.kvflash.enabled:
                module, function = bind.split(":")
                getattr(importlib.import_module(module), function)(self, luce)
            if luce.pflash.enabled:
                from vllm_luce.pflash.worker import bind as bind_pflash

                bind_pflash(self, luce)

        return initialize_kv_cache

    return make


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "initialize_kv_cache", ledger_signature(TARGET),
                       binding_wrapper("vllm_luce.kvflash.worker:bind_v1"))
