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
        if any(installed and installed.engine_client for installed in done.values()):
            from vllm_luce.patches import apply_engine_client_patches

            apply_engine_client_patches(pflash=pflash is not None)
        global _logged
        if not _logged:
            _logged = True
            from vllm_luce.model_executor import registry

            logger.info("%s: executors: %s; active features: %s%s", tag(),
                        registry.description, luce.describe(),
                        "".join(f"; {name}: {installed.summary}" for name, installed in
                                (("DFlash gate", gated), ("KVFlash", kvflash), ("PFlash", pflash)) if installed))

    return __post_init__


def apply() -> bool:
    from vllm.config.vllm import VllmConfig

    return wrap_method(VllmConfig, "__post_init__", ledger_signature("vllm.config.vllm:VllmConfig.__post_init__"),
                       _make_wrapper)


def _make_guard(original):
    @functools.wraps(original)
    def __post_init__(self, *args, **kwargs) -> None:
        import vllm

        from vllm_luce import compat

        if compat.asked_in_config(getattr(self, "additional_config", None)):
            raise compat.refusal(vllm.__version__, ["the `luce` section of additional_config"])
        original(self, *args, **kwargs)

    return __post_init__


def apply_guard(owner: type | None = None) -> bool:
    """On a vLLM vllm-luce does not support, in place of every patch: ``owner.__post_init__`` (VllmConfig's) stops
    when the config's additional_config asks for a feature and runs vLLM's code unchanged otherwise. Its signature is
    not checked (a release the ledger has none for): the guard passes every argument through."""
    if owner is None:
        from vllm.config.vllm import VllmConfig as owner
    if "__post_init__" not in owner.__dict__:
        return False
    from vllm_luce.source_signatures import of_function

    try:
        signature = of_function(owner.__dict__["__post_init__"])
    except (OSError, TypeError):  # no source to read: vLLM runs alone, the command line and environment checked
        return False
    return wrap_method(owner, "__post_init__", signature, _make_guard)
