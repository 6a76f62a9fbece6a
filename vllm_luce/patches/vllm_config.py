"""Patch: validate `--additional-config '{"luce": ...}'` when vLLM builds its VllmConfig (see LEDGER)."""

from __future__ import annotations

import functools

from vllm_luce.config import LuceConfig
from vllm_luce.log import logger, tag
from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

_logged = False


def _make_wrapper(original):
    @functools.wraps(original)
    def __post_init__(self) -> None:
        luce = LuceConfig.from_vllm_config(self)
        luce.attach(self)  # resolved once: the engine core and workers read these
        from vllm_luce import hooks

        for hook in hooks.features(hooks.BEFORE_CHECKS):
            hook.function()(self, luce)
        original(self)
        # the feature installs of vllm_luce/hooks.py in table order: the DFlash gate, KVFlash, PFlash; a feature's
        # first row says what it installed (a later row of the feature only checks)
        done: dict = {}
        for hook in hooks.features(hooks.AFTER_CHECKS):
            installed = hook.function()(self, luce)
            done.setdefault(hook.feature, installed)
        gated, kvflash, pflash = done["DFlash"], done["KVFlash"], done["PFlash"]
        if pflash or gated or (kvflash and not kvflash.startswith("SFI")):
            from vllm_luce.patches import apply_engine_client_patches

            apply_engine_client_patches(pflash=bool(pflash))
        global _logged
        if not _logged:
            _logged = True
            from vllm_luce.model_executor import registry

            logger.info("%s: executors: %s; active features: %s%s", tag(),
                        registry.description, luce.describe(),
                        (f"; DFlash gate: {gated}" if gated else "") + (f"; KVFlash: {kvflash}" if kvflash else "")
                        + (f"; PFlash: {pflash}" if pflash else ""))

    return __post_init__


def apply() -> bool:
    from vllm.config.vllm import VllmConfig

    return wrap_method(VllmConfig, "__post_init__", ledger_signature("vllm.config.vllm:VllmConfig.__post_init__"),
                       _make_wrapper)
