"""vLLM 0.26's Model Runner V2 on a hybrid target (``vllm_luce/vllm026/recurrent_state_v2.py``): before a step's
forward, the decode rows without drafts whose request verified drafts in its latest step get their Gated DeltaNet
state moved from slot a - 1 to slot 0 and their count set to 1; drafting rows, rows that verified nothing and other
blocks are left alone. A stand-in for V2's runner and model state, with vLLM's own MambaSpec; batch rows in another
order than the request state indices, as V2 gathers them."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.patches.test_recurrent_state_v1 import K, hybrid_runner, window
from vllm_luce import hooks
from vllm_luce.vllm026 import recurrent_state_v2

SLOTS = 1 + K  # each request's state slots in the Gated DeltaNet group's table
V2_KV_CACHE = "vllm.v1.worker.gpu.model_runner:GPUModelRunner.initialize_kv_cache"


class ModelState:
    def __init__(self, max_num_reqs: int):
        self.num_accepted_tokens_gpu = torch.ones(max_num_reqs, dtype=torch.int32)
        self.preprocessed = 0

    def preprocess_state(self, input_batch, block_tables, kv_cache_config, num_computed_tokens):
        self.preprocessed += 1


def runner(*, speculative=True, hybrid=True, mode="none", max_num_reqs=4):
    # request state index s owns blocks 1 + s * SLOTS ... (SLOTS of them): its row of the mamba group's table
    tables = torch.arange(max_num_reqs * SLOTS, dtype=torch.int32).view(max_num_reqs, SLOTS) + 1
    return hybrid_runner(32, speculative=speculative, hybrid=hybrid, mode=mode, model_state=ModelState(max_num_reqs),
                         tables=tables)


def step(run, states: list[int], drafts: list[int] | None, kept: list[int] | None = None):
    """One step of the requests at ``states`` (batch order), each with its draft count (None: the gate's plain
    step, no draft counts at all); then (``kept``) each row's kept tokens, as V2's postprocess_state stores them."""
    batch = SimpleNamespace(num_reqs=len(states), idx_mapping_np=np.array(states, dtype=np.int32),
                            idx_mapping=torch.tensor(states, dtype=torch.int32),
                            num_draft_tokens_per_req=None if drafts is None else np.array(drafts, dtype=np.int32))
    gathered = tuple(torch.zeros(len(states), SLOTS, dtype=torch.int32) if g == 0 else run.tables[states]
                     for g in range(2))
    run.model_state.preprocess_state(batch, gathered, run.kv_cache_config, None)
    if kept is not None:
        run.model_state.num_accepted_tokens_gpu[states] = torch.tensor(kept, dtype=torch.int32)


@pytest.fixture
def on_026(monkeypatch):
    monkeypatch.setattr("vllm_luce.compat.installed_series", lambda: "0.26")


def bound(run):
    state = recurrent_state_v2.bind_v2(run, None)
    assert state is not None and run.luce_recurrent_state is state
    return state


def test_a_plain_step_after_a_verify_step_reads_the_last_kept_tokens_state(on_026):
    run = runner()
    state = bound(run)
    step(run, [2, 0], [K, K], kept=[3, 1])  # a verify step: request 2 kept 3 tokens, request 0 kept 1
    before = {name: tuple(t.clone() for t in run.layers[name].kv_cache) for name in ("linear.0", "linear.1")}
    step(run, [0, 2], None)  # the gate's plain step, the batch in another order
    assert run.model_state.preprocessed == 2  # vLLM's preprocess_state still runs after
    first, third = int(run.tables[2, 0]), int(run.tables[2, 2])
    for name, (conv0, ssm0) in before.items():
        conv, ssm = run.layers[name].kv_cache
        assert torch.equal(ssm[first], ssm0[third]) and not torch.equal(ssm0[first], ssm0[third])
        assert torch.equal(window(conv[first], 0), window(conv0[first], 2))
        untouched = torch.ones(len(ssm), dtype=torch.bool)
        untouched[first] = False  # request 0 kept one token: its state stays where it is
        assert torch.equal(ssm[untouched], ssm0[untouched]) and torch.equal(conv[untouched], conv0[untouched])
    assert run.model_state.num_accepted_tokens_gpu.tolist() == [1, 1, 1, 1]
    assert state.rows_moved == 2
    moved = [t.clone() for t in run.layers["linear.0"].kv_cache]
    step(run, [0, 2], None)  # a plain step after a plain step: nothing moves
    assert all(torch.equal(t, m) for t, m in zip(run.layers["linear.0"].kv_cache, moved)) and state.rows_moved == 2


def test_drafting_rows_and_rows_that_verified_nothing_are_left_to_vllm(on_026):
    """A row with drafts takes V2's verify path, which reads slot a - 1 itself; a row whose latest step had no
    drafts (a prefill chunk, a plain step) has its state at slot 0 already."""
    run = runner()
    state = bound(run)
    step(run, [1], [0], kept=[1])  # request 1: a prefill chunk (no drafts)
    step(run, [1, 3], [K, K], kept=[4, 2])
    before = [t.clone() for t in run.layers["linear.1"].kv_cache]
    step(run, [3, 1, 0], [K, 0, 0])  # 3 drafts again; 1 has none (moved); 0 is new (never verified)
    conv, ssm = run.layers["linear.1"].kv_cache
    assert state.rows_moved == 1
    assert torch.equal(ssm[int(run.tables[1, 0])], before[1][int(run.tables[1, 3])])
    untouched = torch.ones(len(ssm), dtype=torch.bool)
    untouched[int(run.tables[1, 0])] = False
    assert torch.equal(ssm[untouched], before[1][untouched])
    assert run.model_state.num_accepted_tokens_gpu.tolist() == [1, 1, 1, 2]  # 3 keeps its count for its verify read


@pytest.mark.parametrize("speculative, hybrid, mode", [(False, True, "none"), (True, False, "none"),
                                                       (True, True, "align"), (True, True, "all")])
def test_engines_without_speculation_recurrent_layers_or_first_slots_are_left_alone(on_026, speculative, hybrid, mode):
    run = runner(speculative=speculative, hybrid=hybrid, mode=mode)
    assert recurrent_state_v2.bind_v2(run, None) is None and not hasattr(run, "luce_recurrent_state")


def test_later_series_take_the_verify_path_themselves():
    """vLLM 0.32 sends a decode row without drafts through the verify path (the installed series here)."""
    assert recurrent_state_v2.bind_v2(runner(), None) is None


def test_the_binding_runs_after_the_v2_kv_cache_with_dflash():
    rows = [h for h in hooks.features(target=V2_KV_CACHE) if h.feature == "DFlash"]
    assert "vllm_luce.vllm026.recurrent_state_v2:bind_v2" in {h.owners[0] for h in rows}
    wrap = next(h for h in hooks.HOOKS if h.target == recurrent_state_v2.PREPROCESS)
    assert wrap.kind == hooks.INSTANCE_WRAP and "vLLM 0.26" in wrap.remove_when
