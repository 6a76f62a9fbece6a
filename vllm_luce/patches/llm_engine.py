"""Patch: check the per-request switches (`request_args`), and PFlash compresses a long prompt, before LLMEngine
(offline ``LLM``) adds a request (see LEDGER)."""

from __future__ import annotations

import functools

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

TARGET = "vllm.v1.engine.llm_engine:LLMEngine.add_request"


def _make_wrapper(original):
    @functools.wraps(original)
    def add_request(self, request_id, prompt, params, *args, **kwargs):
        from vllm_luce import request_args
        from vllm_luce.kvflash import frontend as kvflash_frontend
        from vllm_luce.pflash import frontend

        request_args.check(params)  # a bad luce_dflash / luce_pflash value: vLLM answers the ValueError with a 400
        ids, _ = frontend.admit(self, prompt, params)
        if ids is not None:
            from vllm_luce.pflash.worker import RPC

            try:
                answer = frontend.first_answer(self.collective_rpc(RPC, args=(ids,)))
            except Exception as e:  # noqa: BLE001 - the request goes on uncompressed
                answer = frontend.rpc_failed(e)
            prompt, _ = frontend.compress(prompt, answer, request_id, self)
        kvflash_frontend.check(self, prompt, params)  # a prompt KVFlash could never serve: a ValueError naming the setting
        return original(self, request_id, prompt, params, *args, **kwargs)

    return add_request


def apply() -> bool:
    from vllm.v1.engine.llm_engine import LLMEngine

    return wrap_method(LLMEngine, "add_request", ledger_signature(TARGET), _make_wrapper)
