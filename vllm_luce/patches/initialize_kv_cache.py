"""What the two initialize_kv_cache patches share (``initialize_kv_cache_v1.py`` on Model Runner V1,
``initialize_kv_cache_v2.py`` on Model Runner V2): the wrapper that runs the worker-side feature installs once the
runner's KV cache exists (see LEDGER). Not a patch of its own."""

from __future__ import annotations

import functools


def binding_wrapper(target: str):
    """A wrapper factory for initialize_kv_cache (``target``) that, after vLLM's code, runs the feature-install rows
    of vllm_luce/hooks.py for that runner whose feature is on (``bind(runner, luce)``): KVFlash's binding, DFlash's
    plain steps (V2; the binding returns at once without a DFlash speculator), then PFlash's drafter (rank 0).

    Not on a profiling call (``is_profiling``): V1 sizes its CUDA graphs' memory with a minimal KV cache first and
    the real one follows. Bound there too, every pooled layer captured its queries twice a step (a second gather
    per layer in each decode graph), and a stale runtime kept its pinned host slab.

    On vLLM 0.34's extensible KV cache (``extensible``: sized later, after warm-up) the features' device memory for
    after that sizing is then held (``device_reserve.hold``) until the extend_kv_cache patch frees it."""

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
            if kwargs.get("extensible", args[2] if len(args) > 2 else False):
                from vllm_luce.patches import device_reserve

                device_reserve.hold(self)

        return initialize_kv_cache

    return make
