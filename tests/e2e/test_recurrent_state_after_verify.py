"""A hybrid target's recurrent state where vLLM's V1 runner reads it after a verify step, through real vLLM (CPU, V1
runner, the trained Qwen3.6 pair): ``patches/recurrent_state_v1.py``'s realigner on and off.

* A request the scheduler leaves out of a step (here: one decoding request every other step, as when the requests
  before it spend the step's token budget) comes back as new and is read at slot 0: without the realigner it parts
  from plain decoding at a clear top-1; with it, it keeps plain decoding's tokens.
* vLLM 0.26's decode rows without drafts, emulated on vLLM 0.32's CPU backend: 0.32 counts such a row as a
  speculative row with zero drafts; 0.26 marks it non-speculative (-1), and the plain path reads slot 0 and conv
  offset 0. The emulation marks those rows -1 after ``_prepare_inputs``, as 0.26's runner does; the GPU tier runs
  vLLM 0.26 itself (``tests/gpu/test_dflash.py``)."""

import pytest

from tests.e2e.dflash_probe import assert_same_until_near_tie, greedy_with_margins
from tests.e2e.test_dflash_gate import PROMPTS, SWITCHING, build, greedy, scheduler
from vllm_luce.spec_decode.gate import SpecGate

pytestmark = pytest.mark.e2e
_EMULATED: set = set()


def _realigner(worker, on: bool) -> None:
    """The realigner of the worker's runner on (a fresh one, the patch's) or off."""
    from vllm_luce.patches.recurrent_state_v1 import Realigner

    runner = worker.model_runner
    runner.luce_recurrent_realigner = Realigner.of(runner) if on else None


def _moved(worker) -> int:
    realigner = worker.model_runner.luce_recurrent_realigner
    return realigner.rows_moved if realigner is not None else 0


def _emulate_vllm_026(worker) -> None:
    """Draft-less rows marked non-speculative after ``_prepare_inputs`` (the patched one), as vLLM 0.26 marks them."""
    runner = worker.model_runner
    if id(runner) in _EMULATED:
        return
    _EMULATED.add(id(runner))
    prepare = runner._prepare_inputs

    def prepare_as_026(scheduler_output, num_scheduled_tokens):
        result = prepare(scheduler_output, num_scheduled_tokens)
        drafts, marks = scheduler_output.scheduled_spec_decode_tokens, runner.num_decode_draft_tokens.np
        for row, req_id in enumerate(runner.input_batch.req_ids):
            if not drafts.get(req_id):
                marks[row] = -1
        return result

    runner._prepare_inputs = prepare_as_026


def _leave_out_one_decoding_request_every(sched, every: int) -> dict:
    """Every ``every``-th step one decoding request, each in turn, sits the step out (its previous step verified
    drafts: every step speculates); counts the steps and those left out."""
    schedule, seen = sched.schedule, {"steps": 0, "left_out": 0}

    def leaving_one_out(*args, **kwargs):
        seen["steps"] += 1
        decoding = [r for r in sched.running if r.num_computed_tokens > r.num_prompt_tokens]
        left = decoding[seen["left_out"] % len(decoding)] if seen["steps"] % every == 0 and decoding else None
        if left is not None:
            index = sched.running.index(left)
            sched.running.remove(left)
            seen["left_out"] += 1
        try:
            return schedule(*args, **kwargs)
        finally:
            if left is not None:
                sched.running.insert(index, left)

    sched.schedule = leaving_one_out
    return seen


@pytest.fixture(scope="module")
def plain_tokens():
    from fixtures.trained import trained_model

    plain = build(trained_model("qwen36-target"), max_len=1024)
    try:
        yield greedy_with_margins(plain, PROMPTS, 64)
    finally:
        del plain


def test_a_request_back_after_a_step_away_keeps_plain_decodings_tokens_only_with_the_realigner(plain_tokens):
    from vllm import LLM

    from fixtures.trained import trained_model

    expected, margins = plain_tokens
    llm = LLM(model=str(trained_model("qwen36-target")), enforce_eager=True, max_model_len=1024, dtype="bfloat16",
              seed=0, enable_prefix_caching=False, speculative_config={"model": str(trained_model("qwen36-dflash"))},
              additional_config={"luce": {"dflash": {"gate": False}}})  # every step speculates
    try:
        seen = _leave_out_one_decoding_request_every(scheduler(llm), 2)
        runs = {}
        for on in (False, True):
            llm.collective_rpc(_realigner, args=(on,))
            seen.update(steps=0, left_out=0)  # the same requests sit out the same steps in both runs
            runs[on] = greedy(llm, 64)
            assert seen["left_out"] > 8, seen
        assert llm.collective_rpc(_moved)[0] >= seen["left_out"] // 2
        with pytest.raises(AssertionError, match="not a near-tie"):  # vLLM as it is: the state of slot 0
            assert_same_until_near_tie(expected, margins, runs[False])
        assert assert_same_until_near_tie(expected, margins, runs[True]) >= len(PROMPTS) - 1
    finally:
        del llm


def test_a_plain_step_after_a_verify_step_reads_the_accepted_state_only_with_the_realigner(plain_tokens):
    from fixtures.trained import trained_model

    expected, margins = plain_tokens
    llm = build(trained_model("qwen36-target"), trained_model("qwen36-dflash"), max_len=1024)
    try:
        llm.collective_rpc(_emulate_vllm_026)
        runs = {}
        for on in (False, True):
            llm.collective_rpc(_realigner, args=(on,))
            scheduler(llm).luce_gate = SpecGate(SWITCHING)
            runs[on] = greedy(llm, 64)
            decisions = scheduler(llm).luce_gate.decisions
            assert decisions["spec"] > 0 and decisions["plain"] > 0, decisions
        assert llm.collective_rpc(_moved)[0] > 0
        with pytest.raises(AssertionError, match="not a near-tie"):  # vLLM 0.26 as it is: the wrong state
            assert_same_until_near_tie(expected, margins, runs[False])
        assert assert_same_until_near_tie(expected, margins, runs[True]) >= len(PROMPTS) - 1
    finally:
        del llm
