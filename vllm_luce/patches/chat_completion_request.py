"""Patch: chat requests with tools, a tool choice or a response format are marked so that PFlash never
compresses them (see LEDGER)."""

from __future__ import annotations

import functools

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

TARGET = "vllm.entrypoints.openai.chat_completion.protocol:ChatCompletionRequest.to_sampling_params"


def skip_reason(request) -> str | None:
    """Compression cut tool definitions and schemas apart in Lucebox (its issue #327): never for these."""
    if request.tools:
        return "tools"
    if request.tool_choice not in (None, "none", "auto"):
        return "tool choice"
    if request.response_format is not None and getattr(request.response_format, "type", "text") != "text":
        return "response format"
    return None


def _make_wrapper(original):
    @functools.wraps(original)
    def to_sampling_params(self, max_tokens: int, default_sampling_params: dict):
        params = original(self, max_tokens, default_sampling_params)
        reason = skip_reason(self)
        if reason is not None:
            from vllm_luce.pflash.frontend import SKIP_KEY

            from vllm_luce import hooks

            hooks.bind("vllm.sampling_params:SamplingParams.extra_args", params,
                       {**(params.extra_args or {}), SKIP_KEY: reason})
        return params

    return to_sampling_params


def apply() -> bool:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return wrap_method(ChatCompletionRequest, "to_sampling_params", ledger_signature(TARGET), _make_wrapper)
