"""Patch: check the per-request switches (`request_args`), and PFlash compresses a long prompt, before AsyncLLM
(the API server's engine client) adds a request (see LEDGER)."""

from __future__ import annotations

import functools

from vllm_luce.patches import ledger_signature, wrap_method

TARGET = "vllm.v1.engine.async_llm:AsyncLLM.add_request"


def _make_wrapper(original):
    @functools.wraps(original)
    async def add_request(self, request_id, prompt, params, *args, **kwargs):
        from vllm_luce import request_args
        from vllm_luce.pflash import frontend

        request_args.check(params)  # a bad luce_dflash / luce_pflash value: vLLM answers the ValueError with a 400
        ids = frontend.ids_to_score(self, prompt, params)
        if ids is not None:
            try:
                answer = await _score_in_background(self, request_id, ids)
            except Exception as e:  # noqa: BLE001 - the request goes on uncompressed
                answer = frontend.rpc_failed(e)
            prompt = frontend.compressed_prompt(prompt, answer, request_id, self)
        return await original(self, request_id, prompt, params, *args, **kwargs)

    return add_request


async def _score_in_background(engine, request_id: str, ids: list[int]):
    """Start the workers' scoring pass, then ask for its answer every ``POLL_S`` until it is ready: the engine core
    answers between steps, so requests already running, or arriving meanwhile, keep being served."""
    import asyncio
    import uuid

    from vllm_luce.pflash import frontend
    from vllm_luce.pflash.worker import POLL_S, RESULT, START

    ticket = f"{request_id}-{uuid.uuid4().hex[:8]}"
    if not frontend.first_answer(await engine.collective_rpc(START, args=(ticket, ids))):
        return None
    while True:
        answer = frontend.first_answer(await engine.collective_rpc(RESULT, args=(ticket,)))
        if not (answer or {}).get("pending"):
            return answer
        await asyncio.sleep(POLL_S)


def apply() -> bool:
    from vllm.v1.engine.async_llm import AsyncLLM

    return wrap_method(AsyncLLM, "add_request", ledger_signature(TARGET), _make_wrapper)
