"""Patch (Model Runner V1, every supported series): a hybrid target's row that vLLM reads at slot 0 while the
request's last verify step left its Gated DeltaNet state at slot a - 1 (``spec_decode/recurrent_state.py``) gets its
state moved to slot 0 first (see LEDGER).

A request the scheduler leaves out of a step (the requests before it spent the step's token budget) leaves V1's
persistent batch and comes back as new: one kept token, slot 0. Its greedy answer then changed at a clear top-1,
because of what other requests did (the load-and-fault suite's canaries). Two wraps of GPUModelRunner (the CPU runner
inherits them):

* ``_update_states_after_model_execute``: once vLLM has counted each row's kept tokens on the device, the counts are
  kept by each row's slot-0 block, which is the request's for its life: a count outlives the batch row it had.
* ``_prepare_inputs``: after it, the rows ``rows_to_realign`` names have every Gated DeltaNet layer's state moved to
  slot 0 and conv offset 0, and their kept count set to 1, where vLLM's plain and verify paths then read. Only steps
  with such rows pay (a copy of those rows' states); nothing waits for the device.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.log import logger, tag
from vllm_luce.patches import wrap_method
from vllm_luce.spec_decode.recurrent_state import realign, rows_to_realign, state_layers

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs"
COUNTS = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._update_states_after_model_execute"


class Realigner:
    """One runner's Gated DeltaNet layers (conv state, ssm state, conv window, KV cache group), each request's kept
    tokens of its latest step (on the device, by slot-0 block), and which requests verified drafts in their latest
    step and ran in the runner's latest step."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor, int, int]], conv_dim_first: bool):
        self.layers, self.conv_dim_first = layers, conv_dim_first
        conv = layers[0][0]  # ``of`` builds one only with Gated DeltaNet layers
        self.kept = torch.ones(conv.shape[0], dtype=torch.int32, device=conv.device)
        self.previous: frozenset[str] = frozenset()  # the requests of the latest step
        self.verified: dict[str, bool] = {}  # request -> whether its latest step verified drafts
        self.rows_moved = 0  # for tests and the log

    @classmethod
    def of(cls, runner) -> "Realigner | None":
        """None unless the runner speculates on a target with Gated DeltaNet layers whose state slots are the first
        1 + K of each block-table row (``mamba_cache_mode`` "none", vLLM's mode without prefix caching; the
        prefix-caching modes lay the slots out by position and copy accepted states themselves)."""
        if runner.speculative_config is None or not runner.model_config.is_hybrid \
                or runner.cache_config.mamba_cache_mode != "none":
            return None
        from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
        from vllm.v1.kv_cache_interface import MambaSpec

        layers = state_layers(runner.kv_cache_config.kv_cache_groups, runner.compilation_config.static_forward_context,
                              lambda spec: isinstance(spec, MambaSpec))
        if not layers:
            return None
        logger.info("%s: hybrid target speculating: a row vLLM reads at slot 0 after its request's verify step (back "
                    "after a step away, or without drafts) reads the state of its last kept token (%d Gated DeltaNet "
                    "layers)", tag(), len(layers))
        return cls(layers, is_conv_state_dim_first())

    def after_sample(self, runner, num_reqs: int) -> None:
        """Each row's kept tokens of the step just sampled (vLLM's count on the device), by its slot-0 block."""
        if num_reqs:
            first = runner.input_batch.block_table[self.layers[0][3]].get_device_tensor(num_reqs)[:, 0]
            self.kept.index_copy_(0, first.to(torch.long), runner.num_accepted_tokens.gpu[:num_reqs].to(torch.int32))

    def before_forward(self, runner, scheduler_output) -> None:
        drafts = scheduler_output.scheduled_spec_decode_tokens
        for req_id in (*(getattr(scheduler_output, "finished_req_ids", None) or ()),
                       *(getattr(scheduler_output, "preempted_req_ids", None) or ())):
            self.verified.pop(req_id, None)
        req_ids = list(runner.input_batch.req_ids)
        rows = rows_to_realign(self.previous, self.verified, req_ids, drafts)
        self.previous = frozenset(req_ids)
        self.verified.update((req_id, bool(drafts.get(req_id))) for req_id in req_ids)
        if rows:
            self._move(runner, rows)

    def _move(self, runner, rows: list[int]) -> None:
        accepted_now = runner.num_accepted_tokens.gpu
        index = torch.tensor(rows, dtype=torch.long)
        index = index.pin_memory().to(accepted_now.device, non_blocking=True) \
            if accepted_now.device.type == "cuda" else index.to(accepted_now.device)
        num_reqs, slots = runner.input_batch.num_reqs, {}  # the rows' block-table rows, once per KV cache group
        for _, _, _, group_id in self.layers:
            if group_id not in slots:
                table = runner.input_batch.block_table[group_id].get_device_tensor(num_reqs)
                slots[group_id] = table.index_select(0, index)
        accepted = self.kept.index_select(0, slots[self.layers[0][3]][:, 0].to(torch.long))
        for conv, ssm, window, group_id in self.layers:
            realign(conv, ssm, slots[group_id], accepted, window, self.conv_dim_first)
        accepted_now.index_fill_(0, index, 1)  # where the verify path now reads them: one kept token, slot 0
        self.rows_moved += len(rows)


def _make_prepare(original):
    @functools.wraps(original)
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        result = original(self, scheduler_output, num_scheduled_tokens)
        realigner = getattr(self, "luce_recurrent_realigner", False)
        if realigner is False:
            realigner = self.luce_recurrent_realigner = Realigner.of(self)
        if realigner is not None:
            realigner.before_forward(self, scheduler_output)
        return result

    return _prepare_inputs


def _make_counts(original):
    @functools.wraps(original)
    def _update_states_after_model_execute(self, output_token_ids, scheduler_output):
        result = original(self, output_token_ids, scheduler_output)
        realigner = getattr(self, "luce_recurrent_realigner", None)
        if realigner is not None:
            realigner.after_sample(self, output_token_ids.size(0))
        return result

    return _update_states_after_model_execute


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    done = wrap_method(GPUModelRunner, "_prepare_inputs", ledger_signature(TARGET), _make_prepare)
    return wrap_method(GPUModelRunner, "_update_states_after_model_execute", ledger_signature(COUNTS),
                       _make_counts) or done
