"""Patch: decode-only steps of vLLM's CPU Gated DeltaNet non-speculative path, in a speculating engine,
run the decode a plain engine runs (see LEDGER).

A speculating engine's conv buffer is wide (``width - 1 + K`` columns). Rows without drafts go through
``_spec_aware_nonspec``, which keeps their history in columns ``[0, width - 1)``. Its decode conv is
vLLM's C++ one only on AMX or Arm bf16 CPUs, and there it is handed the whole wide buffer. Elsewhere
it is the torch conv, which costs several times the C++ one (``cpu_gdn_spec.DecodeConv``).

The DFlash gate's plain steps take this path when every request is decoding and accepted one token
last step (``gpu_model_runner_inputs``). Then no recurrent state sits at an offset, and each row's
history is in those columns. Such a step builds the same Gated DeltaNet metadata as an engine without
speculation. Each layer then runs the plain engine's decode: the conv a plain engine runs on the
buffer's first ``width - 1`` columns (``cpu_gdn_spec.plain_conv``), and vLLM's recurrent decode
kernel on each row's state slot. Steps with prompt rows keep vLLM's code.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.patches import ledger_signature, wrap_function

TARGET = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:_spec_aware_nonspec"
ACTIVE = False  # set once applied: gpu_model_runner_inputs routes plain steps here only then


@functools.cache
def _kernels():
    """vLLM's recurrent decode kernel and the plain engine's conv, looked up once (``decode`` runs per layer
    and step)."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as G

    from vllm_luce.patches.cpu_gdn_spec import plain_conv

    return G.ops.fused_sigmoid_gating_delta_rule_update_cpu, plain_conv


def decode(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, conv_buf, ssm_state, width) -> None:
    """Every row decodes one token from the history in its buffer's first ``width - 1`` columns."""
    recurrent_decode, plain_conv = _kernels()
    n, tokens = attn_metadata_i.num_decodes, attn_metadata_i.num_decode_tokens
    # A copy: a column of the block table, even one row long, keeps its row stride, which the kernels refuse.
    slots = attn_metadata_i.non_spec_state_indices_tensor[:n].clone(memory_format=torch.contiguous_format)
    conv_out = plain_conv(layer, slots)(mixed_qkv[:tokens], conv_buf[:, :, : width - 1])
    query, key, value = layer.rearrange_mixed_qkv(conv_out)
    out = recurrent_decode(
        A_log=layer.A_log, dt_bias=layer.dt_bias, q=query, k=key, v=value, a=a[:tokens], b=b[:tokens],
        initial_state_source=ssm_state, initial_state_indices=slots,
        cu_seqlens=attn_metadata_i.non_spec_query_start_loc[: n + 1], use_qk_l2norm_in_kernel=True)
    core_attn_out[:tokens] = out.squeeze(1)


def _make_wrapper(original):
    @functools.wraps(original)
    def _spec_aware_nonspec(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, conv_buf, ssm_state, width):
        if attn_metadata_i.num_prefills or not attn_metadata_i.num_decodes:
            return original(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, conv_buf, ssm_state, width)
        return decode(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, conv_buf, ssm_state, width)

    return _spec_aware_nonspec


def apply() -> bool:
    global ACTIVE
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    done = wrap_function(gdn_attention, "_spec_aware_nonspec", ledger_signature(TARGET), _make_wrapper)
    ACTIVE = True
    return done
