"""vLLM 0.26's decode rows without drafts, emulated on vLLM 0.32's CPU backend (real Gated DeltaNet kernels and state
layout): the trained Qwen3.6 pair under a gate that switches every few steps parts from plain decoding, and with
``vllm026/recurrent_state_v1.py``'s realigner it does not.

vLLM 0.32 counts a decode row without drafts as a speculative row with zero drafts, so its verify path reads the
state where the last verify step left it. vLLM 0.26 marks such a row non-speculative (-1), and the plain path reads
slot 0 and conv offset 0. The emulation marks those rows -1 after ``_prepare_inputs``, as 0.26's runner does; the
GPU tier runs the patch itself on vLLM 0.26 (``tests/gpu/test_dflash.py``)."""

import pytest

from tests.e2e.dflash_probe import assert_same_until_near_tie, greedy_with_margins
from tests.e2e.test_dflash_gate import PROMPTS, SWITCHING, build, greedy, scheduler
from vllm_luce.spec_decode.gate import SpecGate

pytestmark = pytest.mark.e2e
_EMULATION: dict = {}


def _emulate_vllm_026(worker, realign: bool) -> None:
    """In each worker: draft-less rows marked non-speculative as vLLM 0.26 marks them, then (``realign``) the
    realigner moves their state. Called again, it only switches the realigner."""
    from vllm_luce.vllm026.recurrent_state_v1 import Realigner

    runner = worker.model_runner
    _EMULATION["realigner"] = Realigner.of(runner) if realign else None
    if _EMULATION.get("runner") is runner:
        return
    _EMULATION["runner"], prepare = runner, runner._prepare_inputs

    def prepare_as_026(scheduler_output, num_scheduled_tokens):
        result = prepare(scheduler_output, num_scheduled_tokens)
        drafts, marks = scheduler_output.scheduled_spec_decode_tokens, runner.num_decode_draft_tokens.np
        for row, req_id in enumerate(runner.input_batch.req_ids):
            if not drafts.get(req_id):
                marks[row] = -1
        if _EMULATION["realigner"] is not None:
            _EMULATION["realigner"].before_forward(runner, scheduler_output, num_scheduled_tokens)
        return result

    runner._prepare_inputs = prepare_as_026


def _moved(worker) -> int:
    realigner = _EMULATION["realigner"]
    return realigner.rows_moved if realigner is not None else 0


def test_a_plain_step_after_a_verify_step_reads_the_accepted_state_only_with_the_realigner():
    from fixtures.trained import trained_model

    target, drafter = trained_model("qwen36-target"), trained_model("qwen36-dflash")
    plain = build(target, max_len=1024)
    expected, margins = greedy_with_margins(plain, PROMPTS, 64)
    del plain
    llm = build(target, drafter, max_len=1024)
    try:
        runs = {}
        for realign in (False, True):
            llm.collective_rpc(_emulate_vllm_026, args=(realign,))
            scheduler(llm).luce_gate = SpecGate(SWITCHING)
            runs[realign] = greedy(llm, 64)
            decisions = scheduler(llm).luce_gate.decisions
            assert decisions["spec"] > 0 and decisions["plain"] > 0, decisions
        assert llm.collective_rpc(_moved)[0] > 0
        with pytest.raises(AssertionError, match="not a near-tie"):  # vLLM 0.26 as it is: the wrong state
            assert_same_until_near_tie(expected, margins, runs[False])
        assert assert_same_until_near_tie(expected, margins, runs[True]) >= len(PROMPTS) - 1
    finally:
        del llm
