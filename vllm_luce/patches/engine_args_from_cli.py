"""Patch: with PFlash on, `vllm serve` adds vllm-luce's usage middleware to its app, which shows each response what
PFlash did to its prompts (`pflash/usage_report.py`; see LEDGER)."""

from __future__ import annotations

import functools
from typing import Any

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

TARGET = "vllm.engine.arg_utils:EngineArgs.from_cli_args"
MIDDLEWARE_ROW = "argparse:Namespace.middleware (vLLM's --middleware)"


def add_usage_middleware(args: Any, additional_config: Any) -> bool:
    """Append the usage middleware to the parsed ``--middleware`` list (an API server's arguments) when the luce
    settings switch PFlash on; True when it is there afterwards."""
    from vllm_luce.config import LuceConfig, LuceConfigError
    from vllm_luce.pflash.usage_report import MIDDLEWARE

    middleware = getattr(args, "middleware", None)
    if not isinstance(middleware, list):
        return False  # a parser without --middleware (run_batch, a caller's own namespace)
    if MIDDLEWARE in middleware:
        return True
    try:
        pflash = LuceConfig.from_sources(additional_config).pflash.enabled
    except LuceConfigError:
        return False  # the VllmConfig patch stops startup naming the setting
    if pflash:
        from vllm_luce import hooks

        hooks.bind(MIDDLEWARE_ROW, args, [*middleware, MIDDLEWARE])  # a new list: vLLM's default one stays empty
    return pflash


def _make_wrapper(original):
    @functools.wraps(original)
    def from_cli_args(cls, args):
        engine_args = original(cls, args)
        add_usage_middleware(args, getattr(engine_args, "additional_config", None))
        return engine_args

    return from_cli_args


def apply() -> bool:
    from vllm.engine.arg_utils import EngineArgs

    return wrap_method(EngineArgs, "from_cli_args", ledger_signature(TARGET), _make_wrapper)
