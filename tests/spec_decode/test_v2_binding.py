"""What the DFlash bindings rely on in Model Runner V2 (the GPU default in vLLM 0.33), checked
against the installed vLLM. V2 needs a GPU and Triton, so it cannot run here; these tests
pin the contract instead:

* the gate lives in the scheduler and reaches V2 as ``SchedulerOutput.num_spec_tokens_to_schedule``,
  which V2 passes to its speculator and uses to blank drafts past it;
* V2's speculators compute draft logits through the drafter model's ``compute_logits``, so the
  Luce drafter class (non-finite guard, confidences) applies to V2 as well;
* with async scheduling (V2's default) the gated async scheduler sizes its placeholders from the
  same value.

Not bound on V2: cutting each request's verify width (V1 only, ``patches/take_draft_token_ids_v1.py``):
V2 keeps drafts on the GPU and verifies what it scheduled.
"""

import inspect
from types import SimpleNamespace

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.worker.gpu import model_runner as v2
from vllm.v1.worker.gpu.spec_decode import speculator as v2_speculator
from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

from vllm_luce.hooks import GATED_SCHEDULERS
from vllm_luce.schedulers import LuceGatedAsyncScheduler, LuceGatedScheduler
from vllm_luce.spec_decode.gate import GateConfig, SpecGate
from vllm_luce.spec_decode.scheduler import GatedLookup


def test_v2_runner_takes_the_draft_length_from_the_scheduler():
    execute = inspect.getsource(v2.GPUModelRunner.execute_model)
    assert "num_spec_tokens_to_schedule=scheduler_output.num_spec_tokens_to_schedule" in execute
    sample = inspect.getsource(v2.GPUModelRunner.sample_tokens)
    assert "num_speculative_tokens=num_spec_tokens" in sample
    assert "draft_tokens[:, num_spec_tokens:] = -1" in sample


def test_v2_dflash_speculator_accepts_a_per_step_draft_length_and_uses_compute_logits():
    assert "num_speculative_tokens" in inspect.signature(DFlashSpeculator.propose).parameters
    assert "self.model.compute_logits(" in inspect.getsource(v2_speculator)


def test_async_scheduler_sizes_placeholders_from_the_scheduled_draft_length():
    assert issubclass(LuceGatedAsyncScheduler, AsyncScheduler)
    source = inspect.getsource(AsyncScheduler._update_after_schedule)
    assert "scheduler_output.num_spec_tokens_to_schedule" in source
    # hooks.py names the classes by path (so the config patch need not import the scheduler)
    assert GATED_SCHEDULERS[True] == f"{LuceGatedAsyncScheduler.__module__}.{LuceGatedAsyncScheduler.__name__}"
    assert GATED_SCHEDULERS[False] == f"{LuceGatedScheduler.__module__}.{LuceGatedScheduler.__name__}"


def test_gated_lookup_answers_the_gates_decision():
    fake = SimpleNamespace(luce_gate=SpecGate(GateConfig(run_length=2, explore_every=3, min_samples=1)),
                           luce_max_spec_tokens=15, running=[SimpleNamespace(request_id="r")], waiting=[],
                           max_num_running_reqs=8)
    lookup = GatedLookup(fake)
    answers = [lookup[8] for _ in range(6)]
    assert set(answers) == {0, 15} and answers[:2] == [0, 0] and answers[2:4] == [15, 15]  # plain first
