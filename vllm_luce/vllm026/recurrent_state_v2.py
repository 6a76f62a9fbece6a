"""vLLM 0.26, Model Runner V2 on a hybrid target: a decode row without drafts after its request's verify step reads
its Gated DeltaNet state where that step left it (``spec_decode/recurrent_state.py``).

V2 keeps each request's kept-token count a across batch changes (``MambaHybridModelState.num_accepted_tokens_gpu``,
by request state index), and its verify path reads slot a - 1. On vLLM 0.26 a decode row without drafts takes the
plain path (``GDNAttentionMetadataBuilder.build``: no draft count >= 0, or a batch whose draft counts sum to 0),
which reads slot 0 and conv offset 0: the state after the first token of the verify step, not after its last kept
one. The DFlash gate's plain steps are such steps, so on V2 (which 0.26 runs for a hybrid target only where forced)
greedy answers parted from plain decoding at clear top-1 gaps under the gate (tests/gpu/test_dflash.py, the batch
churn test; docs/gpu.md). vLLM 0.32 sends those rows through the verify path, which applies the count; this module
goes with 0.26.

``bind_v2`` wraps the model state's ``preprocess_state`` (real batches only, after the step's block tables are
gathered, before the attention metadata reads the counts): the rows without drafts whose request verified drafts in
its latest step get every Gated DeltaNet layer's state moved to slot 0 and conv offset 0, and their count set to 1.
Only steps with such rows pay (a copy of those rows' states); nothing waits for the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vllm_luce import hooks
from vllm_luce.log import logger, tag
from vllm_luce.spec_decode.recurrent_state import StateLayer, realign, state_layers

PREPROCESS = "vllm.v1.worker.gpu.model_states.mamba_hybrid:MambaHybridModelState.preprocess_state"


class RecurrentStateV2:
    """One V2 runner's Gated DeltaNet layers, its model state's kept counts (by request state index) and, by the same
    index, whether the request's latest step verified drafts."""

    def __init__(self, layers: list[StateLayer], conv_dim_first: bool, accepted: torch.Tensor):
        self.layers, self.conv_dim_first, self.accepted = layers, conv_dim_first, accepted
        # A state index a finished request leaves keeps its flag until a new request's first step clears it; vLLM
        # resets that index's count to 1 (add_request), so a stale flag costs at most one copy of a state onto itself.
        self.verified = np.zeros(accepted.shape[0], dtype=bool)
        self.rows_moved = 0  # for tests and the log

    def before_forward(self, input_batch: Any, block_tables: tuple[torch.Tensor, ...]) -> None:
        num_reqs = input_batch.num_reqs
        if not num_reqs:
            return
        index = np.asarray(input_batch.idx_mapping_np[:num_reqs])
        drafts = input_batch.num_draft_tokens_per_req
        drafting = np.zeros(num_reqs, dtype=bool) if drafts is None else np.asarray(drafts[:num_reqs]) > 0
        rows = np.flatnonzero(self.verified[index] & ~drafting)
        self.verified[index] = drafting
        if rows.size:
            self._move(torch.from_numpy(rows), input_batch.idx_mapping, block_tables)

    def _move(self, rows: torch.Tensor, idx_mapping: torch.Tensor, block_tables: tuple[torch.Tensor, ...]) -> None:
        device = self.accepted.device
        rows = rows.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else rows.to(device)
        states = idx_mapping.index_select(0, rows).to(torch.long)
        accepted, slots = self.accepted.index_select(0, states), {}
        for conv, ssm, window, group_id in self.layers:
            if group_id not in slots:
                slots[group_id] = block_tables[group_id].index_select(0, rows)
            realign(conv, ssm, slots[group_id], accepted, window, self.conv_dim_first)
        self.accepted.index_fill_(0, states, 1)  # slot 0 holds the state now: one kept token
        self.rows_moved += rows.numel()


def applies(runner: Any) -> bool:
    """vLLM 0.26's V2 runner speculating on a hybrid target whose state slots are the first 1 + K of each block-table
    row (``mamba_cache_mode`` "none"; the prefix-caching modes copy accepted states themselves)."""
    from vllm_luce.compat import installed_series

    return installed_series() == "0.26" and getattr(runner, "speculative_config", None) is not None \
        and runner.model_config.is_hybrid and runner.cache_config.mamba_cache_mode == "none" \
        and hasattr(getattr(runner, "model_state", None), "num_accepted_tokens_gpu")


def bind_v2(runner: Any, luce: Any) -> RecurrentStateV2 | None:
    """After V2's ``initialize_kv_cache``, where ``applies``: the model state's ``preprocess_state`` moves the rows'
    states first."""
    if not applies(runner):
        return None
    from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
    from vllm.v1.kv_cache_interface import MambaSpec

    layers = state_layers(runner.kv_cache_config.kv_cache_groups, runner.compilation_config.static_forward_context,
                          lambda spec: isinstance(spec, MambaSpec))
    if not layers:
        return None
    model_state = runner.model_state
    state = RecurrentStateV2(layers, is_conv_state_dim_first(), model_state.num_accepted_tokens_gpu)
    preprocess_state = model_state.preprocess_state

    def preprocess_state_after_realigning(input_batch, block_tables, *args, **kwargs):
        state.before_forward(input_batch, block_tables)
        return preprocess_state(input_batch, block_tables, *args, **kwargs)

    hooks.bind(PREPROCESS, model_state, preprocess_state_after_realigning)
    runner.luce_recurrent_state = state
    logger.info("%s: hybrid target speculating (Model Runner V2, vLLM 0.26): a decode row without drafts after its "
                "request's verify step reads the state of its last kept token (%d Gated DeltaNet layers)", tag(),
                len(layers))
    return state
