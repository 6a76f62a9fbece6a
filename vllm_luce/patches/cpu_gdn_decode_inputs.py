"""Patch: vLLM's CPU Gated DeltaNet recurrent decode gets its read-only inputs contiguous in their last
dimension (see LEDGER).

In a speculating engine, a step whose Gated DeltaNet rows are none of them speculative (for instance
KVFlash's prompt-end step, which computes the prompt's last token alone) decodes through
``_spec_aware_nonspec``. There the state indices are column 0 of the speculative ``[requests, 1 + K]`` index
table (stride 1 + K), and ``fused_sigmoid_gating_delta_rule_update_cpu`` stops the engine ("tensor must be
contiguous at last dimension"; through ``vllm serve`` with DFlash and KVFlash on the hybrid target). Made
contiguous they are the same values. The state it updates in place (``initial_state_source``) is passed as is.
"""

from __future__ import annotations

import importlib

import torch

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_function

NAME = "fused_sigmoid_gating_delta_rule_update_cpu"
# The op's module per series (the ledger leaves the other alone): vllm._custom_ops through vLLM 0.33, vllm._cpu_ops,
# the CPU ops' own module, from vLLM 0.34.
TARGETS = (f"vllm._custom_ops:{NAME}", f"vllm._cpu_ops:{NAME}")
IN_PLACE = "initial_state_source"


def last_dim_contiguous(t):
    """``t``, or a copy with row-major strides where its last stride is not 1 (``contiguous()`` keeps the
    stride of a dimension of size 1, which the op checks all the same)."""
    if not hasattr(t, "stride") or t.dim() == 0 or t.stride(-1) == 1:
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _make_wrapper(original):
    def fused_sigmoid_gating_delta_rule_update_cpu(*args, **kwargs):
        # vLLM calls it with keywords; positional inputs before the state are read-only too
        args = tuple(last_dim_contiguous(a) for a in args[:7]) + args[7:]
        kwargs = {k: v if k == IN_PLACE else last_dim_contiguous(v) for k, v in kwargs.items()}
        return original(*args, **kwargs)

    return fused_sigmoid_gating_delta_rule_update_cpu


def target_in_series() -> str | None:
    """The op this vLLM series calls (the first of TARGETS the ledger does not leave alone), else None."""
    return next((t for t in TARGETS if ledger_signature(t) is not None), None)


def apply() -> bool:
    from vllm.platforms import current_platform

    target = target_in_series()
    if not current_platform.is_cpu() or target is None:
        return False
    return wrap_function(importlib.import_module(target.split(":")[0]), NAME, ledger_signature(target), _make_wrapper)
