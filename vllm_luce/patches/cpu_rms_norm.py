"""Patch: grouped RMSNorm weights in vLLM's CPU ``rms_norm`` op (see LEDGER).

vLLM's DFlash drafters normalise the context keys of all their layers in one call: input
``[layers, tokens, heads, head_dim]``, weight ``[layers, head_dim]``, each layer with its own
``k_norm`` weight. The GPU kernel selects the weight row by the outermost index. The CPU op uses
row 0 for every layer. So on CPU every drafter layer after the first attended to context keys
normalised with layer 0's weight, which puts the trained drafter's layer 1 and its logits far from the
reference (docs/fidelity.md, "DFlash drafter: vLLM vs the PyTorch reference"). Here a 2-D weight is applied group by group;
every other call goes to vLLM's op unchanged.
"""

from __future__ import annotations

import functools

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_function

TARGET = "vllm._custom_ops:rms_norm"


def _make_wrapper(original):
    @functools.wraps(original)
    def rms_norm(out, input, weight, epsilon):
        if weight is None or weight.dim() != 2:
            return original(out, input, weight, epsilon)
        if input.shape[0] != weight.shape[0] or input.shape[-1] != weight.shape[1]:
            raise ValueError(f"grouped rms_norm: input {tuple(input.shape)} does not match weight "
                             f"{tuple(weight.shape)} (one weight row per outermost index)")
        for i in range(weight.shape[0]):
            original(out[i], input[i].contiguous(), weight[i].contiguous(), epsilon)
        return None

    return rms_norm


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm import _custom_ops

    return wrap_function(_custom_ops, "rms_norm", ledger_signature(TARGET), _make_wrapper)
