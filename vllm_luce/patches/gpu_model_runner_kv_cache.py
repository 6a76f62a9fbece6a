"""Patch: bind KVFlash to V1's model runner once its KV cache exists (see LEDGER).
``binding_wrapper`` also serves Model Runner V2 (``gpu_v2_model_runner_kv_cache``)."""

from __future__ import annotations

import functools

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.initialize_kv_cache"


def binding_wrapper(target: str):
    """A wrapper factory for initialize_kv_cache (``target``) that, after vLLM's code, runs the feature-install rows
    of vllm_luce/hooks.py for that runner whose feature is on (``bind(runner, luce)``): KVFlash's binding, DFlash's
    plain steps (V2; the binding returns at once without a DFlash speculator), then PFlash's drafter (rank 0).

    Not on a profiling call (``is_profiling``): V1 sizes its CUDA graphs' memory with a minimal KV cache first and
    the real one follows. Bound there too, every pooled layer captured its queries twice a step (a second gather
    per layer in each decode graph), and a stale runtime kept its pinned host slab."""

    def make(original):
        @functools.wraps(original)
        def initialize_kv_cache(self, kv_cache_config, *args, **kwargs):  # the other parameters vary by series
            original(self, kv_cache_config, *args, **kwargs)
            if kwargs.get("is_profiling", args[0] if args else False):
                return
            from vllm_luce import hooks
            from vllm_luce.config import LuceConfig

            luce = LuceConfig.from_vllm_config(self.vllm_config)
            for hook in hooks.features(target=target) + hooks.features(hooks.KV_CACHE_BOTH):
                if getattr(luce, hook.feature.lower()).on_when_used():  # DFlash: on unless switched off
                    hook.function()(self, luce)

        return initialize_kv_cache

    return make


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "initialize_kv_cache", ledger_signature(TARGET),
                       binding_wrapper(TARGET))
