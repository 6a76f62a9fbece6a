"""Patch: vLLM's CPU stand-in for the rejection sampler's ``expand_kernel`` (see LEDGER).

The kernel spreads one value per request over that request's draft tokens. The rejection sampler
calls it for the temperature (float32), top-k (int32) and top-p (float32) of a batch that is not all
greedy. vLLM's CPU version converts its output and input to int64 copies and never writes the result
back, so the float32 output keeps its uninitialised memory and the values are truncated to integers.
The target logits are then divided by that garbage "temperature": every request of a mixed greedy and
sampled batch, greedy ones included, verifies its drafts against corrupted logits. Measured on the
trained Qwen3.6 pair, 32 requests, even ones greedy and odd ones at temperature 0.8: none of the 16
greedy outputs equalled decoding without speculation; they first differed at token 1 or 2, where the
top-two gap was up to 5 nats.

Here the expansion is done in PyTorch for any output dtype other than int64 (an int64 output with
int64 values goes to vLLM's kernel unchanged, which is correct for it).
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_function

TARGET = "vllm.utils.cpu_triton_utils:_expand_kernel_impl"


def expand_to_tokens(output: torch.Tensor, values: torch.Tensor, cu_num_tokens: torch.Tensor,
                     replace_from, replace_to) -> None:
    """``output[t] = values[r]`` for every token ``t`` of request ``r`` (tokens ``cu[r-1]:cu[r]``), with
    ``replace_from`` replaced by ``replace_to``. Written in place, in ``output``'s dtype."""
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(values == replace_from, torch.as_tensor(replace_to, dtype=values.dtype), values)
    total = int(cu_num_tokens[-1]) if len(cu_num_tokens) else 0
    output[:total] = torch.repeat_interleave(values, counts, output_size=total).to(output.dtype)


def _make_wrapper(original):
    @functools.wraps(original)
    def _expand_kernel_impl(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        if output.dtype == torch.int64 and input_val.dtype == torch.int64:
            return original(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS)
        expand_to_tokens(output, input_val, cu_num_tokens, replace_from, replace_to)
        return None

    return _expand_kernel_impl


def apply() -> bool:
    """Must run before the CPU platform registers its kernel overrides, which happens in each worker
    right after vLLM loads its general plugins (this module is imported by that registration)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.utils import cpu_triton_utils

    return wrap_function(cpu_triton_utils, "_expand_kernel_impl", ledger_signature(TARGET), _make_wrapper)
