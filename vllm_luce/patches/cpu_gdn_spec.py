"""Patch: variable draft counts in vLLM's CPU Gated DeltaNet speculative path (see LEDGER).

Layout of a request's conv buffer ``B`` (dim x state_len, state_len = width - 2 + 1 + K): after a
verify step of ``q`` inputs, ``B[:, :width - 2 + q]`` holds the last ``width - 2`` inputs before the
step followed by the step's ``q`` inputs. The next step, with ``a`` of them accepted
(``num_accepted_tokens``), reads its ``width - 1`` inputs of history at ``B[:, a - 1 : a - 1 + width - 1]``.
vLLM writes that layout only for ``q = 1 + K``; this writes it for every ``q``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_function

TARGET = "vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:_spec_forward"


def roll_conv_and_convolve(buffers: torch.Tensor, slots: torch.Tensor, accepted: torch.Tensor,
                           starts: torch.Tensor, lengths: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                           bias: torch.Tensor | None, silu: bool) -> torch.Tensor:
    """Causal depthwise conv of each request's new inputs over its history, rolling the history.

    buffers [slots, dim, state_len]; x [tokens, dim]; weight [dim, width]. Returns [tokens, dim]."""
    if len(lengths) and bool((lengths == lengths[0]).all()) and int(lengths[0]) > 0:
        return _uniform(buffers, slots, accepted, x, weight, bias, silu, int(lengths[0]))
    return _per_request(buffers, slots, accepted, starts, lengths, x, weight, bias, silu)


def _per_request(buffers, slots, accepted, starts, lengths, x, weight, bias, silu: bool) -> torch.Tensor:
    width = weight.shape[-1]
    out = torch.empty_like(x)
    for i in range(len(lengths)):
        q, start = int(lengths[i]), int(starts[i])
        if q == 0:
            continue
        buf = buffers[int(slots[i])]
        offset = int(accepted[i]) - 1
        prior = buf[:, offset : offset + width - 1].clone()
        new = x[start : start + q].transpose(0, 1).to(buf.dtype)
        y = F.conv1d(torch.cat([prior, new], dim=-1).unsqueeze(0), weight.unsqueeze(1).to(buf.dtype),
                     None if bias is None else bias.to(buf.dtype), groups=weight.shape[0])[0]
        out[start : start + q] = (F.silu(y) if silu else y).transpose(0, 1).to(out.dtype)
        buf[:, : width - 2 + q] = torch.cat([prior[:, 1:], new], dim=-1)
    return out


def _uniform(buffers, slots, accepted, x, weight, bias, silu: bool, q: int) -> torch.Tensor:
    """The same roll for n requests of q inputs each, in batched ops (q = 1, a plain step, goes through
    ``plain_step_conv`` instead when vLLM's decode conv is at hand)."""
    n, width = len(slots), weight.shape[-1]
    slots = slots.long()
    bufs = buffers[slots]  # [n, dim, state_len] (a copy)
    cols = (accepted.long() - 1)[:, None] + torch.arange(width - 1, device=bufs.device)  # [n, width - 1]
    prior = bufs.gather(2, cols[:, None, :].expand(n, bufs.shape[1], width - 1))
    new = x.view(n, q, -1).transpose(1, 2).to(bufs.dtype)  # [n, dim, q]
    seq = torch.cat([prior, new], dim=-1)
    w = weight.to(bufs.dtype)
    y = sum(w[None, :, j, None] * seq[:, :, j : j + q] for j in range(width))
    if bias is not None:
        y = y + bias.to(bufs.dtype)[None, :, None]
    out = (F.silu(y) if silu else y).transpose(1, 2).reshape(n * q, -1).to(x.dtype)
    bufs[:, :, : width - 2 + q] = torch.cat([prior[:, :, 1:], new], dim=-1)
    buffers[slots] = bufs
    return out


def realignments(slots: torch.Tensor, accepted: torch.Tensor) -> list[tuple[int, int]]:
    """(slot, column) of each row whose history does not start at column 0 (it accepted a > 1)."""
    rows = (accepted != 1).nonzero().flatten().tolist()
    return [(int(slots[i]), int(accepted[i]) - 1) for i in rows]


def plain_step_conv(buffers: torch.Tensor, slots: torch.Tensor, accepted: torch.Tensor, x: torch.Tensor,
                    convolve, realign: list[tuple[int, int]] | None = None) -> torch.Tensor:
    """One input per request (a plain step of a speculating engine): realign, then a plain decode conv.

    Rows whose last step accepted ``a > 1`` tokens keep their history at column ``a - 1``; they are
    moved to column 0 first (``realign``, from ``realignments``, when the caller has it). Then
    ``convolve(x, history)`` runs a plain decode's conv on the buffer's first ``width - 1``
    columns, which it reads and rolls in place (``DecodeConv`` / ``PackedDecodeConv``)."""
    history = buffers[:, :, : convolve.width - 1]
    for slot, offset in realignments(slots, accepted) if realign is None else realign:
        history[slot] = buffers[slot, :, offset : offset + convolve.width - 1].clone()
    return convolve(x, history)


class DecodeConv:
    """vLLM's torch decode conv (``ops.cpu.causal_conv1d.causal_conv1d_update_cpu``) on plain weights: several
    times faster than a batched torch roll (docs/benchmarks.md, "Measurements behind design choices in the code")."""

    def __init__(self, op, weight: torch.Tensor, bias: torch.Tensor | None, activation, slots_i32: torch.Tensor):
        self.op, self.weight, self.bias, self.activation, self.slots = op, weight, bias, activation, slots_i32
        self.width = weight.shape[-1]

    def __call__(self, x: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        return self.op(x=x, conv_state=history, weight=self.weight, bias=self.bias, activation=self.activation,
                       conv_state_indices=self.slots)


class PackedDecodeConv:
    """The C++ decode conv a plain engine uses where the CPU has bf16 dot products (AVX512-BF16 or Arm
    bf16), on vLLM's packed weights; faster than ``DecodeConv`` (docs/benchmarks.md, "Measurements behind design
    choices in the code")."""

    def __init__(self, op, weight: torch.Tensor, bias: torch.Tensor | None, silu: bool, slots_i32: torch.Tensor,
                 width: int, packed: bool = True):
        self.op, self.weight, self.bias, self.silu, self.slots = op, weight, bias, silu, slots_i32
        self.width, self.packed = width, packed

    def __call__(self, x: torch.Tensor, history: torch.Tensor) -> torch.Tensor:
        return self.op(x=x, conv_states=history, weight=self.weight, bias=self.bias, silu_activation=self.silu,
                       conv_state_indices=self.slots, is_weight_packed=self.packed)


@dataclass
class StepPlan:
    """What every Gated DeltaNet layer of one step reads from the step's metadata, computed once."""

    qsl: torch.Tensor
    lengths: torch.Tensor
    plain: bool  # one input per request
    slots: torch.Tensor
    accepted: torch.Tensor
    realign: list[tuple[int, int]]
    slots_i32: torch.Tensor
    state_indices_i32: torch.Tensor
    accepted_i32: torch.Tensor
    cu_seqlens_i32: torch.Tensor


def step_plan(attn_metadata_i, full: int) -> StepPlan | None:
    """The step's plan, or None where every request verifies ``full`` inputs (vLLM's own layout)."""
    plan = getattr(attn_metadata_i, "_luce_plan", False)
    if plan is not False:
        return plan
    n = attn_metadata_i.num_spec_decodes
    qsl = attn_metadata_i.spec_query_start_loc[: n + 1]
    lengths = qsl[1:] - qsl[:-1]
    plan = None
    if n and not bool((lengths == full).all()):
        slots = attn_metadata_i.spec_state_indices_tensor[:n, 0]
        accepted = attn_metadata_i.num_accepted_tokens[:n]
        plain = bool((lengths == 1).all())
        plan = StepPlan(qsl=qsl, lengths=lengths, plain=plain, slots=slots, accepted=accepted,
                        realign=realignments(slots, accepted) if plain else [],
                        slots_i32=slots.to(torch.int32).contiguous(),
                        state_indices_i32=attn_metadata_i.spec_state_indices_tensor[:n].to(torch.int32).contiguous(),
                        accepted_i32=accepted.to(torch.int32).contiguous(),
                        cu_seqlens_i32=qsl.to(torch.int32).contiguous())
    try:  # every layer of the step shares this metadata object
        attn_metadata_i._luce_plan = plan
    except AttributeError:
        pass
    return plan


@functools.cache
def cpp_conv_supported() -> bool:
    """vLLM's own test for its C++ conv (bf16 dot products: AVX512-BF16 or Arm bf16)."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as G

    return torch.cpu._is_avx512_bf16_supported() or G.is_arm_bf16()


def plain_conv(layer, slots_i32: torch.Tensor):
    """The conv a plain engine's decode runs on this layer, for the requests in these state slots (see
    ``PackedDecodeConv``)."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as G

    params = getattr(layer, "_luce_plain_conv", None)
    if params is None:  # fixed after loading: computed once per layer
        unpacked = G._unpacked_conv_weight(layer)
        if cpp_conv_supported():
            packed = getattr(layer.conv1d, "_cpu_unpacked_conv_weight", None) is not None  # vLLM packed it at load
            params = (PackedDecodeConv, G._causal_conv1d_update_cpu, layer.conv1d.weight if packed else unpacked,
                      layer.conv1d.bias, layer.activation == "silu", unpacked.shape[-1], packed)
        else:
            params = (DecodeConv, G.causal_conv1d_update_cpu, unpacked, layer.conv1d.bias, layer.activation)
        layer._luce_plain_conv = params
    kind, op, weight, bias, activation, *rest = params
    return kind(op, weight, bias, activation, slots_i32, *rest)


def _make_wrapper(original):
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention as G

    @functools.wraps(original)
    def _spec_forward(layer, attn_metadata_i, mixed_qkv_spec, b_spec, a_spec, conv_buf, ssm_state, width,
                      state_len):
        plan = step_plan(attn_metadata_i, state_len - width + 2)  # full = 1 + num_speculative_tokens
        if plan is None:
            return original(layer, attn_metadata_i, mixed_qkv_spec, b_spec, a_spec, conv_buf, ssm_state,
                            width, state_len)
        if plan.plain:
            conv_out = plain_step_conv(conv_buf, plan.slots, plan.accepted, mixed_qkv_spec,
                                       plain_conv(layer, plan.slots_i32), plan.realign)
        else:
            conv_out = roll_conv_and_convolve(conv_buf, plan.slots, plan.accepted, plan.qsl[:-1], plan.lengths,
                                              mixed_qkv_spec, G._unpacked_conv_weight(layer), layer.conv1d.bias,
                                              layer.activation == "silu")
        query, key, value = layer.rearrange_mixed_qkv(conv_out)
        return G.ops.fused_sigmoid_gating_delta_rule_update_spec_cpu(
            A_log=layer.A_log, dt_bias=layer.dt_bias, q=query.squeeze(0), k=key.squeeze(0), v=value.squeeze(0),
            a=a_spec, b=b_spec, initial_state_source=ssm_state, spec_state_indices=plan.state_indices_i32,
            num_accepted_tokens=plan.accepted_i32, cu_seqlens=plan.cu_seqlens_i32, use_qk_l2norm_in_kernel=True)

    return _spec_forward


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    return wrap_function(gdn_attention, "_spec_forward", ledger_signature(TARGET), _make_wrapper)
