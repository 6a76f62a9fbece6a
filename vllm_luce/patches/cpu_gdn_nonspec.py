"""Patch: draft-free decode-only steps of vLLM's CPU Gated DeltaNet path in a speculating engine run the
decode a plain engine runs (see LEDGER).

A speculating engine's conv buffer is wide (``width - 1 + K`` columns). A step without drafts goes from
``_cpu_gdn_attention_spec_aware`` to ``_spec_aware_nonspec``, which keeps each row's history in columns
``[0, width - 1)``. Its decode conv is vLLM's C++ one only on AMX or Arm bf16 CPUs, and there it is
handed the whole wide buffer, of which the op reads and rolls only those columns: on the weights vLLM packed
at load, the same outputs, bit for bit, and buffer as the plain engine's conv on that view (measured with the
real op; ``tests/patches/test_cpu_isa.py``). Elsewhere it is the torch conv, which costs several times the
C++ one (``cpu_gdn_spec.DecodeConv``).

The DFlash gate's plain steps take this path when every request is decoding and accepted one token
last step (``gpu_model_runner_inputs``). Then no recurrent state sits at an offset, and each row's
history is in those columns. Such a step builds the same Gated DeltaNet metadata as an engine without
speculation. Each layer then runs the plain engine's decode: the conv a plain engine runs on the
buffer's first ``width - 1`` columns (``cpu_gdn_spec.plain_conv``), and vLLM's recurrent decode
kernel on each row's state slot. Steps with prompt rows or drafts keep vLLM's code.

The wrapper sits on ``_cpu_gdn_attention_spec_aware`` rather than ``_spec_aware_nonspec``: that entry
builds the buffer's and the state's views on every call, 7 µs a layer on the development CPU (42 µs a
step on the trained six-layer target). Here they are built once per layer and cache binding, and the
state slots once per step.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.patches import ledger_signature, wrap_function

TARGET = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:_cpu_gdn_attention_spec_aware"
ACTIVE = False  # set once applied: gpu_model_runner_inputs routes plain steps here only then


@functools.cache
def _kernels():
    """vLLM's recurrent decode kernel and the plain engine's conv, looked up once (``decode`` runs per layer
    and step)."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as G

    from vllm_luce.patches.cpu_gdn_spec import plain_conv

    return G.ops.fused_sigmoid_gating_delta_rule_update_cpu, plain_conv


def state_views(layer, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv buffer's history columns (slots x dim x ``width - 1``) and the recurrent state (slots x heads x
    k x v) of this layer's cache, as vLLM's spec-aware path views them, kept until the cache is rebound."""
    cache = layer.kv_cache
    kept = getattr(layer, "_luce_state_views", None)
    if kept is None or kept[0] is not cache:
        from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as G

        kept = (cache, G._conv_buffer_view(layer)[:, :, : width - 1], G._ssm_state_view(layer))
        layer._luce_state_views = kept
    return kept[1], kept[2]


def step_slots(attn_metadata_i) -> torch.Tensor:
    """The decoding rows' state slots as a dense tensor, once per step (every layer shares the metadata).
    A copy: a column of the block table, even one row long, keeps its row stride, which the kernels refuse."""
    slots = getattr(attn_metadata_i, "_luce_slots", None)
    if slots is None:
        n = attn_metadata_i.num_decodes
        slots = attn_metadata_i.non_spec_state_indices_tensor[:n].clone(memory_format=torch.contiguous_format)
        try:
            attn_metadata_i._luce_slots = slots
        except AttributeError:  # a metadata class with __slots__: copy per layer
            pass
    return slots


def decode(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, history, ssm_state) -> None:
    """Every row decodes one token from the history in its buffer's first ``width - 1`` columns
    (``history``, that slice of the buffer)."""
    recurrent_decode, plain_conv = _kernels()
    n, tokens = attn_metadata_i.num_decodes, attn_metadata_i.num_decode_tokens
    slots = step_slots(attn_metadata_i)
    conv_out = plain_conv(layer, slots)(mixed_qkv[:tokens].contiguous(), history)
    query, key, value = layer.rearrange_mixed_qkv(conv_out)
    out = recurrent_decode(
        A_log=layer.A_log, dt_bias=layer.dt_bias, q=query, k=key, v=value, a=a[:tokens].contiguous(),
        b=b[:tokens].contiguous(), initial_state_source=ssm_state, initial_state_indices=slots,
        cu_seqlens=attn_metadata_i.non_spec_query_start_loc[: n + 1], use_qk_l2norm_in_kernel=True)
    core_attn_out[:tokens] = out.squeeze(1)


def _make_wrapper(original):
    @functools.wraps(original)
    def _cpu_gdn_attention_spec_aware(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, width, state_len):
        if (attn_metadata_i.spec_sequence_masks is not None or attn_metadata_i.num_prefills
                or not attn_metadata_i.num_decodes):
            return original(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, width, state_len)
        history, ssm_state = state_views(layer, width)
        return decode(layer, attn_metadata_i, mixed_qkv, b, a, core_attn_out, history, ssm_state)

    return _cpu_gdn_attention_spec_aware


def apply() -> bool:
    global ACTIVE
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    done = wrap_function(gdn_attention, "_cpu_gdn_attention_spec_aware", ledger_signature(TARGET), _make_wrapper)
    ACTIVE = True
    return done
