"""Patch: validate `--additional-config '{"luce": ...}'` when vLLM builds its VllmConfig (see LEDGER)."""

from __future__ import annotations

import functools

from vllm_luce.config import LuceConfig
from vllm_luce.log import logger, tag
from vllm_luce.patches import ledger_signature, wrap_method

_logged = False


def _make_wrapper(original):
    @functools.wraps(original)
    def __post_init__(self) -> None:
        luce = LuceConfig.from_vllm_config(self)
        from vllm_luce.kvflash.install import before_vllm_checks

        before_vllm_checks(self, luce)
        original(self)
        from vllm_luce.spec_decode.install import install_gate

        gated = install_gate(self, luce)
        from vllm_luce.kvflash.install import install_kvflash

        kvflash = install_kvflash(self, luce)
        from vllm_luce.pflash.install import install_pflash

        pflash = install_pflash(self, luce)
        if pflash or gated:
            from vllm_luce.patches import apply_engine_client_patches

            apply_engine_client_patches(pflash=bool(pflash))
        global _logged
        if not _logged:
            _logged = True
            import vllm_luce

            logger.info("%s: executors: %s; active features: %s%s", tag(),
                        vllm_luce.executors_description, luce.describe(),
                        (f"; DFlash gate: {gated}" if gated else "") + (f"; KVFlash: {kvflash}" if kvflash else "")
                        + (f"; PFlash: {pflash}" if pflash else ""))

    return __post_init__


def apply() -> bool:
    from vllm.config.vllm import VllmConfig

    return wrap_method(VllmConfig, "__post_init__", ledger_signature("vllm.config.vllm:VllmConfig.__post_init__"),
                       _make_wrapper)
