"""vLLM 0.26's Model Runner V1 on a hybrid target (``vllm_luce/vllm026/spec_rows_first_v1.py``): after vLLM's own
reorder (the real ``reorder_batch_to_split_decodes_and_prefills``), the rows that verify drafts precede every other
row, so the gates vLLM 0.26's Gated DeltaNet layer hands their recurrent update (the batch's first tokens') are their
own. The batches are the GPU run's (issue 67): a decode row cut to one token among the verifying rows, a row whose
drafts the budget trimmed, prefill chunks behind."""

from types import SimpleNamespace

import itertools

import numpy as np
import pytest
import torch
from vllm.v1.attention.backends.utils import reorder_batch_to_split_decodes_and_prefills

from vllm_luce.vllm026.spec_rows_first_v1 import _make_wrapper, spec_rows_first, verifying

K = 15


class Batch:
    """The InputBatch fields vLLM's reorder reads, with its swap_states."""

    def __init__(self, rows: list[tuple[str, int, int]]):  # (request, computed tokens, prompt tokens)
        self.req_ids = [r for r, _, _ in rows]
        self.num_computed_tokens_cpu = np.array([c for _, c, _ in rows])
        self.num_prompt_tokens = np.array([p for _, _, p in rows])
        self.swaps = 0

    def swap_states(self, i: int, j: int) -> None:
        self.req_ids[i], self.req_ids[j] = self.req_ids[j], self.req_ids[i]
        for values in (self.num_computed_tokens_cpu, self.num_prompt_tokens):
            values[[i, j]] = values[[j, i]]
        self.swaps += 1


class Runner:
    def __init__(self, batch: Batch, hybrid: bool = True):
        self.input_batch, self.model_config = batch, SimpleNamespace(is_hybrid=hybrid)

    def _may_reorder_batch(self, scheduler_output) -> None:  # vLLM's, with the GDN builder's threshold (1 + K)
        reorder_batch_to_split_decodes_and_prefills(self.input_batch, scheduler_output, decode_threshold=1 + K)


def step_23() -> tuple[Batch, SimpleNamespace]:
    """The paging engine's step 23 on the H100, in its persistent-batch order: 8 rows verifying 15 drafts, request
    3 cut to one token without drafts, request 4's drafts trimmed to 5 by the token budget, request 10 prefilling."""
    rows, n, drafts = [], {}, {}
    for r in range(10):
        rows.append((f"{r}", 500, 400))
        n[f"{r}"], drafts[f"{r}"] = 1 + K, [7] * K
    del drafts["3"]
    n["3"], n["4"], drafts["4"] = 1, 6, [7] * 5
    rows.insert(2, ("10", 300, 900))  # a prefill chunk between them, as the batch's free row may put it
    n["10"] = 153
    return Batch(rows), SimpleNamespace(num_scheduled_tokens=n, scheduled_spec_decode_tokens=drafts)


def spec_gates(batch: Batch, out) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's gate (its index in the step), as vLLM 0.26's Gated DeltaNet layer hands the verifying rows'
    recurrent update (the batch's first tokens) and as their own (gathered by token index, as 0.32 does)."""
    lens = torch.tensor([out.num_scheduled_tokens[r] for r in batch.req_ids])
    mask = torch.tensor(verifying(batch.req_ids, out.num_scheduled_tokens, out.scheduled_spec_decode_tokens))
    token_mask = torch.repeat_interleave(mask, lens)
    spec_tokens = torch.argsort(token_mask.to(torch.int8), stable=True)[int((~token_mask).sum()):]
    gates = torch.arange(int(lens.sum()))
    return gates[: spec_tokens.numel()], gates[spec_tokens]


def test_vllm_026_hands_the_verifying_rows_other_rows_gates_after_its_own_reorder():
    batch, out = step_23()
    Runner(batch)._may_reorder_batch(out)
    handed, own = spec_gates(batch, out)
    assert not torch.equal(handed, own)  # the fault this patch removes, with vLLM's reorder alone


def test_after_the_patch_every_verifying_row_reads_its_own_gates_and_prefills_stay_behind():
    batch, out = step_23()
    runner = Runner(batch)
    _make_wrapper(Runner._may_reorder_batch)(runner, out)
    handed, own = spec_gates(batch, out)
    assert torch.equal(handed, own)
    is_spec = verifying(batch.req_ids, out.num_scheduled_tokens, out.scheduled_spec_decode_tokens)
    assert is_spec == [True] * 9 + [False] * 2
    assert batch.req_ids[-2:] == ["3", "10"]  # the cut decode row stays among the decode rows, the prefill last


@pytest.mark.parametrize("hybrid, drafts", [(False, {"0": [7] * K}), (True, {})])
def test_no_swap_without_a_hybrid_target_or_drafts(hybrid, drafts):
    batch = Batch([("1", 500, 400), ("0", 500, 400)])
    out = SimpleNamespace(num_scheduled_tokens={"0": 1 + K, "1": 1}, scheduled_spec_decode_tokens=drafts)
    _make_wrapper(Runner._may_reorder_batch)(Runner(batch, hybrid=hybrid), out)
    assert batch.req_ids == ["1", "0"] and batch.swaps == 0


def test_a_row_whose_scheduled_tokens_are_not_its_drafts_and_one_is_not_verifying():
    n = {"a": 1 + K, "b": 1, "c": 4, "d": 1}
    drafts = {"a": [7] * K, "b": [], "c": [7] * K}  # b: an empty list (a draft count of 0); c: cut short
    assert verifying(["a", "b", "c", "d"], n, drafts) == [True, True, False, False]


@pytest.mark.parametrize("size", range(9))
def test_the_swaps_put_every_verifying_row_first_once_each(size):
    for is_spec in itertools.product([False, True], repeat=size):
        check_swaps(list(is_spec))


def check_swaps(is_spec: list[bool]) -> None:
    order = list(is_spec)
    swaps = spec_rows_first(is_spec)
    for i, j in swaps:
        assert i < j and not order[i] and order[j]
        order[i], order[j] = order[j], order[i]
    assert order == sorted(is_spec, reverse=True)
    assert len(swaps) == sum(1 for s in is_spec[: sum(is_spec)] if not s)
