"""V1's ``sample_tokens`` on the step ``gpu_model_runner_inputs`` prepared on the plain path: vLLM's own code
with the speculative config hidden, then the step's drafter context held as ``gpu_model_runner_propose``
holds it, one accepted token per request recorded on hybrid targets, and the KV connector finalized. Every
other step, and asynchronous scheduling, keep vLLM's code.
(End to end, tests/e2e/test_dflash_gate.py checks greedy output and drafts while the gate switches modes.)"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

pytest.importorskip("vllm.v1.spec_decode.dflash")

from vllm_luce.patches import gpu_model_runner_sample as P  # noqa: E402
from vllm_luce.patches.dflash_proposer import deferred  # noqa: E402


def make(*, marked=True, hybrid=False, async_scheduling=False, rows=10):
    from vllm.v1.spec_decode.dflash import DFlashProposer

    drafter = DFlashProposer.__new__(DFlashProposer)  # only the attributes the hold touches
    drafter.max_num_tokens, drafter.block_size, drafter.num_speculative_tokens = 64, 16, 15
    so = SimpleNamespace(total_num_scheduled_tokens=7)
    aux = [torch.randn(rows, 4), torch.randn(rows, 4)]
    cad = SimpleNamespace(num_actual_tokens=7, slot_mapping=torch.arange(200, 200 + rows))
    state = SimpleNamespace(scheduler_output=so, aux_hidden_states=aux, hidden_states=torch.randn(rows, 4),
                            spec_decode_common_attn_metadata=cad)
    spec = SimpleNamespace(name="dflash")
    events = []
    runner = SimpleNamespace(
        execute_model_state=state, _luce_draft_free_output=so if marked else None, speculative_config=spec,
        use_async_scheduling=async_scheduling, model_config=SimpleNamespace(is_hybrid=hybrid), drafter=drafter,
        use_aux_hidden_state_outputs=True, positions=torch.arange(100, 100 + rows), max_num_reqs=8,
        device=torch.device("cpu"), finalize_kv_connector=lambda: events.append("finalize"))
    runner._get_positions = lambda n: runner.positions[:n]
    runner.input_batch = SimpleNamespace(num_accepted_tokens_cpu=np.array([3, 1, 4, 5]))  # after a verify step
    runner.num_accepted_tokens = SimpleNamespace(gpu=torch.tensor([3, 1, 4, 5]))
    return runner, spec, aux, events


def run(runner, fail=False):
    seen = []

    def original(self, grammar_output):
        seen.append((self.speculative_config, grammar_output))
        self.execute_model_state = None  # vLLM clears it before sampling
        if fail:
            raise RuntimeError("boom")
        return SimpleNamespace(req_ids=["a", "b", "c"])

    return P._make_wrapper(original)(runner, "grammar"), seen


def test_the_marked_step_samples_plainly_then_holds_its_context_and_finalizes():
    runner, spec, aux, events = make()
    out, seen = run(runner)
    assert out.req_ids == ["a", "b", "c"] and seen == [(None, "grammar")] and runner.speculative_config is spec
    assert events == ["finalize"] and runner.drafter.num_speculative_tokens == 0
    features, positions, slots = deferred(runner.drafter).take(torch.tensor([[12, 13]]), 16)  # slots 200-209
    assert torch.equal(features, torch.cat([a[:7] for a in aux], dim=-1))
    assert positions.tolist() == list(range(100, 107)) and slots.tolist() == list(range(200, 207))


@pytest.mark.parametrize("hybrid", [True, False])
def test_a_hybrid_target_records_one_accepted_token_per_request(hybrid):
    """As vLLM's own update does for rows of one sampled token (its result checked against it below)."""
    runner, spec, _, events = make(hybrid=hybrid)
    run(runner)  # three requests
    want = [1, 1, 1, 5] if hybrid else [3, 1, 4, 5]
    assert runner.input_batch.num_accepted_tokens_cpu.tolist() == want
    assert runner.num_accepted_tokens.gpu.tolist() == want and events == ["finalize"]


def test_the_recorded_counts_are_what_vllms_update_records_for_one_token_rows():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    def runner():
        return SimpleNamespace(
            speculative_config=object(), model_config=SimpleNamespace(is_hybrid=True),
            cache_config=SimpleNamespace(mamba_cache_mode="none"), num_accepted_tokens_event=SimpleNamespace(
                record=lambda: None), input_batch=SimpleNamespace(
                num_accepted_tokens_cpu_tensor=torch.tensor([3, 1, 4, 5], dtype=torch.int32)),
            num_accepted_tokens=SimpleNamespace(gpu=torch.tensor([3, 1, 4, 5], dtype=torch.int32)))

    theirs, ours = runner(), runner()
    GPUModelRunner._update_states_after_model_execute(theirs, torch.zeros(3, 1, dtype=torch.int32), None)
    ours.input_batch.num_accepted_tokens_cpu = ours.input_batch.num_accepted_tokens_cpu_tensor.numpy()
    P.record_one_accepted_token(ours, 3)
    assert torch.equal(theirs.input_batch.num_accepted_tokens_cpu_tensor, ours.input_batch.num_accepted_tokens_cpu_tensor)
    assert torch.equal(theirs.num_accepted_tokens.gpu, ours.num_accepted_tokens.gpu)


@pytest.mark.parametrize("change", [dict(marked=False), dict(async_scheduling=True)])
def test_other_steps_and_asynchronous_scheduling_keep_vllms_code(change):
    runner, spec, _, events = make(**change)
    out, seen = run(runner)
    assert seen == [(spec, "grammar")] and events == [] and deferred(runner.drafter).take(
        torch.tensor([[12, 13]]), 16) is None


def test_a_step_without_kept_state_keeps_vllms_code():
    runner, spec, _, events = make()
    runner.execute_model_state = None
    _, seen = run(runner)
    assert seen == [(spec, "grammar")] and events == []


def test_the_speculative_config_comes_back_when_vllms_code_raises():
    runner, spec, _, events = make()
    with pytest.raises(RuntimeError, match="boom"):
        run(runner, fail=True)
    assert runner.speculative_config is spec and events == []
