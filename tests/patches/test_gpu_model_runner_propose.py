"""The V1 runner's plain-step shortcut: K = 0 holds the step's context without vLLM's proposer input
preparation; every other step, and any runner that reads the prepared inputs, keeps vLLM's path.
(End to end, tests/e2e/test_dflash_gate.py compares drafts with the context held and written each step.)"""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm.v1.spec_decode.dflash")


def make_runner(*, k_next=0, padded=True, async_spec=False):
    from vllm.v1.spec_decode.dflash import DFlashProposer

    drafter = DFlashProposer.__new__(DFlashProposer)  # only the attributes the shortcut touches
    drafter.max_num_tokens, drafter.block_size, drafter.supports_mm_inputs = 64, 16, False
    drafter.num_speculative_tokens, drafter.device = 15, torch.device("cpu")
    runner = SimpleNamespace(
        drafter=drafter, speculative_config=SimpleNamespace(disable_padded_drafter_batch=not padded),
        valid_sampled_token_count_event=None, use_async_spec_decode=async_spec, supports_mm_inputs=False,
        use_aux_hidden_state_outputs=True, get_model=lambda: SimpleNamespace(),
        positions=torch.arange(100, 110), _draft_probs="stale", _draft_prob_req_ids="stale")
    runner._get_positions = lambda n: runner.positions[:n]
    scheduler_output = SimpleNamespace(num_spec_tokens_to_schedule=k_next, total_num_scheduled_tokens=7)
    return runner, scheduler_output


def run(runner, scheduler_output, rows=10):
    """One propose call with 7 scheduled tokens in ``rows``-row inputs (more rows: a padded batch)."""
    from vllm_luce.patches.gpu_model_runner_propose import _make_wrapper

    calls = []
    wrapped = _make_wrapper(lambda *args: calls.append(args) or "vllm's drafts")
    aux = [torch.randn(rows, 4), torch.randn(rows, 4)]
    runner.positions = runner.positions[:rows]
    cad = SimpleNamespace(num_actual_tokens=7, slot_mapping=torch.arange(200, 200 + rows), batch_size=lambda: 3)
    out = wrapped(runner, scheduler_output, None, None, torch.randn(10, 4), None, aux, None, cad, None)
    return out, calls, aux


@pytest.mark.parametrize("rows", [10, 7], ids=["padded", "unpadded"])
def test_a_plain_step_holds_every_scheduled_tokens_context_and_drafts_nothing(rows):
    from vllm_luce.patches.dflash_proposer import deferred

    runner, scheduler_output = make_runner()
    out, calls, aux = run(runner, scheduler_output, rows)
    assert calls == [] and out == [] and runner.drafter.num_speculative_tokens == 0
    assert runner._draft_probs is None and runner._draft_prob_req_ids is None
    features, positions, slots = deferred(runner.drafter).take(torch.tensor([[12, 13]]), 16)  # slots 200-209
    assert torch.equal(features, torch.cat([a[:7] for a in aux], dim=-1))
    assert positions.tolist() == list(range(100, 107)) and slots.tolist() == list(range(200, 207))


@pytest.mark.parametrize("change", [dict(k_next=15), dict(padded=False), dict(async_spec=True)])
def test_drafting_steps_and_runners_that_read_the_prepared_inputs_keep_vllms_path(change):
    from vllm_luce.patches.dflash_proposer import deferred

    runner, scheduler_output = make_runner(**change)
    out, calls, _ = run(runner, scheduler_output)
    assert out == "vllm's drafts" and len(calls) == 1 and len(deferred(runner.drafter)) == 0


def test_the_runners_fixed_conditions_are_worked_out_once_and_k_is_read_every_step():
    from vllm_luce.patches.gpu_model_runner_propose import holds_plain_step

    runner, scheduler_output = make_runner()
    models = []
    runner.get_model = lambda: models.append(1) or SimpleNamespace()
    assert holds_plain_step(runner, scheduler_output) and holds_plain_step(runner, scheduler_output)
    scheduler_output.num_spec_tokens_to_schedule = 15
    assert not holds_plain_step(runner, scheduler_output)
    assert len(models) == 1


@pytest.mark.parametrize("device, from_config, default, expected", [
    ("cpu", (2, 5), None, True), ("cpu", None, (1, 3), True), ("cpu", (0, 3), None, False),
    ("cuda", (2, 5), None, False)], ids=["cpu", "cpu, model default", "layer 0's input", "cuda"])
def test_plain_steps_hold_features_by_reference_only_where_they_are_new_tensors(device, from_config, default,
                                                                               expected):
    """On CPU the target layers' outputs are new each step and held as they are; layer 0's input can be the
    runner's input-embeddings buffer, and a GPU's CUDA graph outputs are fixed buffers: both are copied."""
    from vllm_luce.patches.dflash_proposer import deferred
    from vllm_luce.patches.gpu_model_runner_propose import features_are_new_tensors
    from vllm_luce.spec_decode.deferred_context import DeferredContextByReference

    runner, scheduler_output = make_runner()
    runner.device = torch.device(device)
    runner._get_eagle3_aux_layers_from_config = lambda: from_config
    runner.get_model = lambda: SimpleNamespace(get_eagle3_default_aux_hidden_state_layers=lambda: default)
    assert features_are_new_tensors(runner) is expected
    if device == "cpu":
        scheduler_output.num_spec_tokens_to_schedule = 15  # the runner's first step drafts (vLLM's path)
        assert run(runner, scheduler_output)[0] == "vllm's drafts"
        assert isinstance(deferred(runner.drafter), DeferredContextByReference) is expected
    bare, _ = make_runner()  # a runner without vLLM's methods keeps the copying store
    assert features_are_new_tensors(bare) is False


def test_a_plain_steps_empty_draft_list_hands_the_scheduler_nothing():
    """V1 keeps a list of drafts as it is; an empty one (a plain step) means no request has drafts, so
    ``take_draft_token_ids`` returns None and the scheduler updates nothing. A tensor of drafts still goes
    through vLLM's path."""
    from vllm_luce.patches.gpu_model_runner import _make_wrapper

    calls = []
    take = _make_wrapper(lambda self: calls.append(1) or "vllm's DraftTokenIds")
    runner = SimpleNamespace(_draft_token_ids=[], drafter=None)
    assert take(runner) is None and calls == []
    runner._draft_token_ids = torch.zeros(3, 2, dtype=torch.long)
    assert take(runner) == "vllm's DraftTokenIds" and calls == [1]


def test_a_large_step_writes_what_is_held_then_its_own_context_at_once(monkeypatch):
    """From ``DIRECT_WRITE_TOKENS`` tokens a step's pass is efficient on its own: the held writes go first
    (they are older), then the step's; nothing is left held. A small step after it is held again."""
    from vllm_luce.patches import dflash_proposer as P

    writes = []
    monkeypatch.setattr(P, "write_context", lambda proposer, f, pos, slots: writes.append(slots.tolist()))
    monkeypatch.setattr(P, "DIRECT_WRITE_TOKENS", 5)
    proposer = SimpleNamespace(max_num_tokens=64, block_size=16, num_speculative_tokens=15, _last_draft_probs=None,
                               device=torch.device("cpu"))
    table = torch.tensor([[12, 13, 14]])  # slots 192-239

    def step(first_slot, n):
        cad = SimpleNamespace(num_actual_tokens=n, slot_mapping=torch.arange(first_slot, first_slot + n),
                              block_table_tensor=table, num_reqs=1)
        P.hold_plain_step(proposer, torch.arange(n), [torch.randn(n, 4)], cad)

    step(200, 2)
    assert writes == [] and P.deferred(proposer).tokens == 2
    step(202, 5)
    assert writes == [[200, 201], [202, 203, 204, 205, 206]] and P.deferred(proposer).tokens == 0
    step(207, 4)
    assert len(writes) == 2 and P.deferred(proposer).tokens == 4


def test_the_store_by_reference_holds_large_steps_and_writes_only_live_requests(monkeypatch):
    """Holding by reference copies nothing, so a prompt-sized step is held too; the next drafting step writes
    the held rows of live requests only, and a request that finished in between costs no pass."""
    from vllm_luce.patches import dflash_proposer as P
    from vllm_luce.spec_decode.deferred_context import DeferredContextByReference

    writes = []
    monkeypatch.setattr(P, "write_context", lambda proposer, f, pos, slots: writes.append(slots.tolist()))
    proposer = SimpleNamespace(max_num_tokens=64, block_size=16, num_speculative_tokens=15, _last_draft_probs=None,
                               _luce_deferred=DeferredContextByReference())

    def cad(first_slot, n, table):
        return SimpleNamespace(num_actual_tokens=n, slot_mapping=torch.arange(first_slot, first_slot + n),
                               block_table_tensor=torch.tensor(table), num_reqs=len(table))

    P.hold_plain_step(proposer, torch.arange(300), [torch.randn(300, 4)], cad(16, 300, [list(range(1, 20))]))
    P.hold_plain_step(proposer, torch.arange(2), [torch.randn(2, 4)], cad(400, 2, [[25]]))  # blocks 1-19 freed
    assert writes == [] and proposer._luce_deferred.tokens == 302
    P.write_deferred(proposer, cad(401, 1, [[25]]))  # a drafting step: only block 25 is live
    assert writes == [[400, 401]] and proposer._luce_deferred.tokens == 0
    P.hold_plain_step(proposer, torch.arange(3), [torch.randn(3, 4)], cad(16, 3, [[1]]))
    P.write_deferred(proposer, cad(416, 1, [[26]]))  # its request finished: no pass at all
    assert writes == [[400, 401]]


def test_a_full_store_by_reference_drops_finished_requests_rows_without_a_pass(monkeypatch):
    """A step that does not fit first makes room in the store: where the live rows fill at most half of it, they
    stay held and no pass runs; otherwise the held rows are written, then the step is held. Where room is made
    but the step still does not fit, the rows kept are written first (they are older), then the step is held."""
    from vllm_luce.patches import dflash_proposer as P
    from vllm_luce.spec_decode.deferred_context import DeferredContextByReference

    writes = []
    monkeypatch.setattr(P, "write_context", lambda proposer, f, pos, slots: writes.append(slots.tolist()))
    proposer = SimpleNamespace(max_num_tokens=64, block_size=16, num_speculative_tokens=15, _last_draft_probs=None,
                               _luce_deferred=DeferredContextByReference(max_tokens=10))

    def step(first_slot, n, table):
        cad = SimpleNamespace(num_actual_tokens=n, slot_mapping=torch.arange(first_slot, first_slot + n),
                              block_table_tensor=torch.tensor(table), num_reqs=len(table))
        P.hold_plain_step(proposer, torch.arange(n), [torch.randn(n, 4)], cad)

    step(16, 6, [[1]])  # a request in block 1, finished after this step
    step(32, 3, [[2]])  # a request in block 2
    step(35, 3, [[2]])  # full: block 1's rows dropped, block 2's 3 kept, then this step held
    assert writes == [] and proposer._luce_deferred.tokens == 6
    step(38, 6, [[2]])  # full again, 6 of 10 rows live: they are written, then the step held
    assert writes == [list(range(32, 38))] and proposer._luce_deferred.tokens == 6
    step(64, 3, [[4]])  # 9 rows held
    step(67, 8, [[4]])  # block 2 finished: 3 rows kept, yet 8 more do not fit: those 3 written, this step held
    assert writes[1:] == [[64, 65, 66]] and proposer._luce_deferred.tokens == 8
