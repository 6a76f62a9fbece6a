"""The engine core's post-step asks the workers for drafts unless the gate's scheduler says the step just executed
drafted nothing, one step at a time. End to end, every gated test in tests/e2e runs through it (drafts after
speculative steps still reach the scheduler: test_dflash_gate.py's acceptance checks)."""

from collections import deque
from types import SimpleNamespace

import pytest

from vllm_luce.patches.engine_core_post_step import _make_wrapper


def post_step(*, drafts, batch_queue=None, executed=True, gated=True):
    asked = []
    scheduler = SimpleNamespace(luce_step_drafts=drafts) if gated else SimpleNamespace()
    core = SimpleNamespace(batch_queue=batch_queue, scheduler=scheduler)
    _make_wrapper(lambda self, model_executed: asked.append(model_executed))(core, executed)
    return asked


def test_a_step_that_drafted_nothing_asks_the_workers_for_nothing():
    assert post_step(drafts=False) == []


@pytest.mark.parametrize("case", [dict(drafts=True), dict(drafts=False, executed=False),
                                  dict(drafts=False, batch_queue=deque()), dict(drafts=False, gated=False)],
                         ids=["a drafting step", "no model run", "a batch queue", "a scheduler without the gate"])
def test_every_other_step_runs_vllms_post_step(case):
    assert post_step(**case) == [case.get("executed", True)]


def test_the_patch_wraps_vllms_engine_core():
    pytest.importorskip("vllm.v1.engine.core")
    from vllm.v1.engine.core import EngineCore

    from vllm_luce.patches import engine_core_post_step

    engine_core_post_step.apply()
    assert EngineCore.post_step.__wrapped__.__qualname__ == "EngineCore.post_step"
