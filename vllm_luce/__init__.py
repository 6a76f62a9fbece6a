"""vllm-luce: a vLLM plugin for long-context serving (DFlash, KVFlash, PFlash, Luce executors).

`register()` is vLLM's `vllm.general_plugins` entry point. vLLM calls it in every process
(API server, engine core, each worker, and its model-inspection subprocess), so it is
idempotent and cheap: a version check, lazy "module:Class" registrations and one patch.
On a vLLM it does not support it registers nothing and patches nothing but the check that a
configuration asks for no vllm-luce feature (``compat.stay_out``).
"""

from __future__ import annotations

from vllm_luce.version import __version__  # noqa: F401 (the package's version, as pip reports it)

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return

    import os
    import sys

    import vllm

    from vllm_luce.compat import check_vllm_version, stay_out
    from vllm_luce.log import logger, tag

    inactive = stay_out(vllm.__version__, os.environ, sys.argv)  # raises where this process asks for a feature
    if inactive is not None:
        from vllm_luce.patches.vllm_config import apply_guard

        logger.warning("%s: %s", tag(), inactive)
        apply_guard()  # a `luce` section in the config vLLM builds stops startup too
        _registered = True
        return

    from vllm_luce.config import LuceConfig
    from vllm_luce.model_executor.registry import register_drafters, register_executors
    from vllm_luce.patches import apply_patches

    warning = check_vllm_version(vllm.__version__)
    if warning:
        logger.warning(warning)
    LuceConfig.from_sources()  # a bad VLLM_LUCE_* variable stops every process, not just one
    executors = register_executors()
    register_drafters()
    apply_patches()
    from vllm_luce import metrics

    metrics.install()
    _registered = True
    # Visible in the engine core and workers; the API server configures logging only after this
    # runs, so there the VllmConfig patch logs the same facts with the active features.
    logger.info("%s: plugin registered on vLLM %s; executors: %s", tag(), vllm.__version__, executors)
