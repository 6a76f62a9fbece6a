"""Patch: after a step that drafted nothing, vLLM's engine core does not ask the workers for drafts (see LEDGER).

With synchronous scheduling, vLLM's engine core asks the workers for the step's drafts after every step of a
speculating engine (``post_step`` calls ``take_draft_token_ids``). Under ``vllm serve`` the worker runs in a
process of its own, so that is a round trip through vLLM's message queues. A step the DFlash gate runs plain
(``num_spec_tokens_to_schedule`` 0) drafts nothing. vllm-luce's own V1 path returns no drafts for it
(``gpu_model_runner``); vLLM's path returns empty ones. The update would set drafts that vLLM's scheduler already
cleared when it scheduled those requests. So the question is skipped: the gate's scheduler records whether the
step it scheduled last drafts (``DFlashGateMixin.luce_step_drafts``). Measured with py-spy on the load test's
engine core (trained pair, 32 streams, about 360 steps, nearly all plain): the round trips took 1.2 s of 80 s.

Only the engine core's own ``step`` path is covered. With a batch queue (pipeline parallelism), the step scheduled
last is not the one just executed, so vLLM's code runs there. Asynchronous scheduling asks for no drafts here
in the first place.
"""

from __future__ import annotations

import functools

from vllm_luce.patches import ledger_signature, wrap_method

TARGET = "vllm.v1.engine.core:EngineCore.post_step"


def drafts_nothing(engine_core) -> bool:
    """The step just executed drafted nothing: its scheduler says so, and the core schedules one step at a time
    (no batch queue). A scheduler other than the gate's has no ``luce_step_drafts``: vLLM's code runs."""
    return engine_core.batch_queue is None and getattr(engine_core.scheduler, "luce_step_drafts", True) is False


def _make_wrapper(original):
    @functools.wraps(original)
    def post_step(self, model_executed):
        if model_executed and drafts_nothing(self):
            return None
        return original(self, model_executed)

    return post_step


def apply() -> bool:
    from vllm.v1.engine.core import EngineCore

    return wrap_method(EngineCore, "post_step", ledger_signature(TARGET), _make_wrapper)
