"""Patch (vLLM 0.26, Model Runner V1): a decode row without drafts that follows a verify step reads its Gated DeltaNet
state where that step left it (see LEDGER and ``recurrent_state.py``). The ledger applies it on vLLM 0.26 only.

vLLM 0.26's V1 runner sends a row without drafts through the plain decode path, which reads the recurrent state at
slot 0 and offset 0; after a verify step that accepted drafts the state is at slot a - 1. The DFlash gate's plain
steps are such rows (so are a stopped request's and a row whose drafts verify width cut to none): on the GPU the
trained Qwen3.6 pair's gated greedy output left plain decoding's at a confident token (docs/gpu.md). After
``_prepare_inputs`` (which has the rows' accepted counts on the GPU) each such row's state
is moved to slot 0 before the forward. Only steps that follow a verify step pay for it.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.log import logger, tag
from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method
from vllm_luce.vllm026.recurrent_state import realign, rows_to_realign

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs"


class Realigner:
    """One runner's Gated DeltaNet layers (conv state, ssm state, conv window, KV cache group) and the requests that
    verified drafts in its latest step."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor, int, int]], conv_dim_first: bool):
        self.layers, self.conv_dim_first = layers, conv_dim_first
        self.drafted: frozenset[str] = frozenset()
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

        context, layers = runner.compilation_config.static_forward_context, []
        for group_id, group in enumerate(runner.kv_cache_config.kv_cache_groups):
            if not isinstance(group.kv_cache_spec, MambaSpec):
                continue
            for name in group.layer_names:
                layer = context[name]
                if hasattr(layer, "conv_kernel_size") and len(layer.kv_cache) == 2:
                    conv, ssm = layer.kv_cache
                    layers.append((conv, ssm, layer.conv_kernel_size - 1, group_id))
        if not layers:
            return None
        logger.info("%s: vLLM 0.26 hybrid target: a decode without drafts after a verify step reads the state of its "
                    "last accepted token (%d Gated DeltaNet layers)", tag(), len(layers))
        return cls(layers, is_conv_state_dim_first())

    def before_forward(self, runner, scheduler_output, num_scheduled) -> None:
        drafts = scheduler_output.scheduled_spec_decode_tokens
        rows = rows_to_realign(self.drafted, runner.input_batch.req_ids, drafts, num_scheduled) if self.drafted else []
        self.drafted = frozenset(req_id for req_id, d in drafts.items() if d)
        if not rows:
            return
        device = runner.num_accepted_tokens.gpu.device
        index = torch.tensor(rows, dtype=torch.long)
        index = index.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else index.to(device)
        accepted = runner.num_accepted_tokens.gpu.index_select(0, index)
        num_reqs, slots = runner.input_batch.num_reqs, {}  # the rows' block-table rows, once per KV cache group
        for conv, ssm, window, group_id in self.layers:
            if group_id not in slots:
                table = runner.input_batch.block_table[group_id].get_device_tensor(num_reqs)
                slots[group_id] = table.index_select(0, index)
            realign(conv, ssm, slots[group_id], accepted, window, self.conv_dim_first)
        self.rows_moved += len(rows)


def _make_wrapper(original):
    @functools.wraps(original)
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        result = original(self, scheduler_output, num_scheduled_tokens)
        realigner = getattr(self, "luce_recurrent_realigner", False)
        if realigner is False:
            realigner = self.luce_recurrent_realigner = Realigner.of(self)
        if realigner is not None:
            realigner.before_forward(self, scheduler_output, num_scheduled_tokens)
        return result

    return _prepare_inputs


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "_prepare_inputs", ledger_signature(TARGET), _make_wrapper)
