"""Patch (vLLM 0.26, Model Runner V1): in a step that verifies drafts on a hybrid target, the rows that verify come
first in the batch, before any row that does not (see LEDGER).

vLLM 0.26's Gated DeltaNet layer (``qwen_gdn_linear_attn.py``, ``_forward_core``) gathers the verifying rows' q, k
and v by their token indices but hands the recurrent update the gates ``a`` and ``b`` of the batch's first tokens.
Those are the verifying rows' own only while every verifying row precedes every other row. V1 orders decode rows
before prefill rows, but a decode row without drafts (a step the scheduler or KVFlash cut to one token) can sit among
the verifying rows: every verifying row after it then read its neighbours' gates, and greedy answers of requests that
never paged parted from vLLM alone at clear top-1s (tests/gpu/test_kvflash_dflash.py, issue 67). From 0.32 the layer
gathers the gates by token index too.

``spec_rows_first`` is the pure part: the swaps that move the verifying rows ahead of the others. Both kinds are
decode rows (a verifying row schedules 1 + its drafts, at most vLLM's reorder threshold), so the swaps stay inside
the decode rows vLLM's own reorder put first, and the regions behind them keep their order. Swapping rows is what
vLLM's reorder does itself (``InputBatch.swap_states``): every per-row state moves with the row.
"""

from __future__ import annotations

import functools
from typing import Mapping, Sequence

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._may_reorder_batch"


def verifying(req_ids: Sequence[str], num_scheduled: Mapping[str, int], drafts: Mapping[str, Sequence]) -> list[bool]:
    """Which rows vLLM 0.26's Gated DeltaNet metadata takes as verifying (``GDNAttentionMetadataBuilder.build``: a
    draft count >= 0, which the runner sets where a request's scheduled tokens are its drafts and one more)."""
    return [req_id in drafts and num_scheduled[req_id] == len(drafts[req_id]) + 1 for req_id in req_ids]


def spec_rows_first(is_spec: Sequence[bool]) -> list[tuple[int, int]]:
    """The swaps (in order) after which every verifying row precedes every other: the first other row trades places
    with the last verifying row, until none is behind another row. At most one swap per row out of place."""
    swaps, is_spec = [], list(is_spec)
    front, back = 0, len(is_spec) - 1
    while True:
        while front < len(is_spec) and is_spec[front]:
            front += 1
        while back >= 0 and not is_spec[back]:
            back -= 1
        if front >= back:
            return swaps
        swaps.append((front, back))
        is_spec[front], is_spec[back] = True, False


def _make_wrapper(original):
    @functools.wraps(original)
    def _may_reorder_batch(self, scheduler_output) -> None:
        original(self, scheduler_output)
        drafts = scheduler_output.scheduled_spec_decode_tokens
        if not drafts or not self.model_config.is_hybrid:
            return
        batch = self.input_batch
        for i, j in spec_rows_first(verifying(batch.req_ids, scheduler_output.num_scheduled_tokens, drafts)):
            batch.swap_states(i, j)

    return _may_reorder_batch


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "_may_reorder_batch", ledger_signature(TARGET), _make_wrapper)
