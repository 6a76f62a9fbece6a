"""Patch: check the per-request switches (`request_args`), and PFlash compresses a long prompt and notes what it did
for the response's usage, before AsyncLLM (the API server's engine client) adds a request (see LEDGER)."""

from __future__ import annotations

import functools

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

TARGET = "vllm.v1.engine.async_llm:AsyncLLM.add_request"


def _make_wrapper(original):
    @functools.wraps(original)
    async def add_request(self, request_id, prompt, params, *args, **kwargs):
        from vllm_luce import request_args
        from vllm_luce.kvflash import frontend as kvflash_frontend
        from vllm_luce.pflash import frontend

        request_args.check(params)  # a bad luce_dflash / luce_pflash value: vLLM answers the ValueError with a 400
        sent = prompt
        ids, outcome = frontend.admit(self, prompt, params)
        if ids is not None:
            from vllm_luce.pflash.client import ScoringClient

            # queued on rank 0's worker, bounded, with a deadline; cancelled if this coroutine is (the client went away)
            answer = await ScoringClient.of(self).score(request_id, ids)
            prompt, outcome = frontend.compress(prompt, answer, request_id, self)
        if outcome is not None:
            from vllm_luce.pflash import usage_report

            usage_report.note(request_id, sent, prompt, outcome)  # the response's usage.luce_pflash
        kvflash_frontend.check(self, prompt, params)  # a prompt KVFlash could never serve: a 400 naming the setting
        return await original(self, request_id, prompt, params, *args, **kwargs)

    return add_request


def apply() -> bool:
    from vllm.v1.engine.async_llm import AsyncLLM

    return wrap_method(AsyncLLM, "add_request", ledger_signature(TARGET), _make_wrapper)
