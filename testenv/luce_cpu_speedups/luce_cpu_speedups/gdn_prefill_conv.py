"""The prompt (prefill) conv of vLLM's CPU Gated DeltaNet in a speculating engine runs vLLM's C++ conv where the
CPU has it, and in float32 where it has not (a test-environment speed-up).

An engine without speculation prefills the conv with vLLM's C++ op on every CPU with bf16 dot products
(AVX512-BF16 or Arm bf16). A speculating engine's wide conv buffer sends its prompt rows through
``_spec_aware_nonspec`` (and ``_spec_aware_nonspec_subset`` for mixed steps), which use that op only on
AMX or Arm bf16 CPUs and otherwise ``causal_conv1d_torch``, a Python loop of ``F.conv1d`` per sequence, an order
of magnitude slower.

Both read a row's initial history from, and write its last ``width - 1`` inputs to, the buffer's first
``width - 1`` columns; the C++ op is given that view of the wide buffer, so the layout the decode and
speculative paths read is the same.

On CPUs without bf16 dot products (AVX2 only) every engine prefills through that loop, whose bf16 depthwise
``F.conv1d`` PyTorch runs channel by channel. There the loop is given float32 weights, so it convolves in float32 (the
bf16 inputs convert exactly) and casts back to bf16 as before.
"""

from __future__ import annotations

import functools

import torch

from luce_cpu_speedups import applied, isa, signature
from vllm_luce.patches import wrap_function

TARGET = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:causal_conv1d_torch"
PAD_SLOT_ID = -1  # vLLM's (v1.attention.backends.utils); only its loop skips such rows


def _make_wrapper(original):
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as G

    native_conv = isa.bf16_dot_products()  # vLLM's C++ conv runs here (read once, when the patch applies)

    @functools.wraps(original)
    def causal_conv1d_torch(x, weight, bias, conv_states, query_start_loc, cache_indices=None,
                            has_initial_state=None, activation="silu", pad_slot_id=-1, **kwargs):
        # vLLM's loop where the C++ op cannot serve the call: another layout than the transposed x vLLM
        # passes, another activation or pad id, or a padded row (the op does not skip it: it writes before
        # the buffer).
        if (kwargs or cache_indices is None or has_initial_state is None or activation not in ("silu", None)
                or pad_slot_id != PAD_SLOT_ID or weight.dim() != 2 or x.dtype != conv_states.dtype
                or x.stride(0) != 1 or not native_conv or bool((cache_indices < 0).any())):
            if weight.dtype == torch.bfloat16 and not native_conv:
                # The loop convolves in its weight's dtype and casts back to x's: bf16 emulated on this CPU
                # (a per-channel loop), float32 vectorised; the inputs convert exactly.
                weight, bias = weight.float(), None if bias is None else bias.float()
            return original(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                            activation, pad_slot_id, **kwargs)
        return G._causal_conv1d_fwd_cpu(
            x=x, weight=weight, bias=bias, conv_states=conv_states[:, :, : weight.shape[-1] - 1],
            query_start_loc=query_start_loc, cache_indices=cache_indices, has_initial_state=has_initial_state,
            silu_activation=activation == "silu", is_weight_packed=False)

    return causal_conv1d_torch


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    done = wrap_function(gdn_attention, "causal_conv1d_torch", signature(TARGET), _make_wrapper)
    if done:
        applied(TARGET)
    return done
