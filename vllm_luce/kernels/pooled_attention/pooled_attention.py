"""Triton kernel: decode attention over a request's pool slots with a slot -> logical position map.

KVFlash keeps each request's full-attention KV in a bounded set of pool slots, in any physical
order; this kernel attends over exactly those slots. Semantics (causality by logical position,
sliding window, GQA) are in naive.py.

Layout: one program per (request, query head). It walks the request's page table one chunk
(``chunk`` rows, a power of two) at a time, loads the KV head's rows of that slot, masks them by
logical position, and keeps an online softmax in fp32. Head dims up to 512 are one BLOCK_D tile.
Pointer offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import autotune


@autotune(configs=[triton.Config({}, num_warps=4), triton.Config({}, num_warps=8), triton.Config({}, num_warps=2)],
          key=["chunk", "BLOCK_D"])
@triton.jit
def _pooled_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, slot_ptr, pos_ptr, seq_lens_ptr,
    stride_qb, stride_qh, stride_qd,
    stride_ks, stride_kt, stride_kh, stride_kd,
    stride_vs, stride_vt, stride_vh, stride_vd,
    stride_ob, stride_oh, stride_od,
    stride_tb, stride_te,
    num_entries, head_dim, group, scale, window,
    chunk: tl.constexpr, BLOCK_D: tl.constexpr, HAS_WINDOW: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    kvh = h // group
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < head_dim
    rows = tl.arange(0, chunk)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + dims * stride_qd, mask=dmask, other=0.0).to(tl.float32)
    seq_len = tl.load(seq_lens_ptr + b)
    m = tl.full([1], float("-inf"), tl.float32)
    l = tl.zeros([1], tl.float32)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for e in range(0, num_entries):
        slot = tl.load(slot_ptr + b * stride_tb + e * stride_te).to(tl.int64)
        start = tl.load(pos_ptr + b * stride_tb + e * stride_te)
        pos = start + rows
        end = tl.where(slot >= 0, seq_len, 0)  # an unused entry (-1) shows nothing
        visible = pos < end
        if HAS_WINDOW:
            visible = visible & (pos > seq_len - 1 - window)
        safe_slot = tl.where(slot >= 0, slot, 0)
        kv_mask = visible[:, None] & dmask[None, :]
        k = tl.load(k_ptr + safe_slot * stride_ks + rows[:, None].to(tl.int64) * stride_kt + kvh * stride_kh
                    + dims[None, :] * stride_kd, mask=kv_mask, other=0.0).to(tl.float32)
        logits = tl.sum(k * q[None, :], axis=1) * scale
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m, tl.max(logits, axis=0))
        # A chunk with nothing visible leaves m at -inf: keep the state unchanged (no NaN from inf - inf).
        alpha = tl.where(m_new == float("-inf"), 1.0, tl.exp(m - m_new))
        p = tl.where(visible, tl.exp(logits - m_new), 0.0)
        v = tl.load(v_ptr + safe_slot * stride_vs + rows[:, None].to(tl.int64) * stride_vt + kvh * stride_vh
                    + dims[None, :] * stride_vd, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    out = tl.where(l > 0, acc / tl.where(l > 0, l, 1.0), 0.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dims * stride_od, out, mask=dmask)


def pooled_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slot_table: torch.Tensor,
                     chunk_pos: torch.Tensor, seq_lens: torch.Tensor, scale: float, window: int | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """See naive.py. Returns fp32 ``[B, Hq, D]`` (or writes ``out``)."""
    B, Hq, D = q.shape
    slots, chunk, Hkv, Dk = k_pool.shape
    if v_pool.shape != k_pool.shape or Dk != D:
        raise ValueError(f"k_pool {tuple(k_pool.shape)} / v_pool {tuple(v_pool.shape)} do not match q {tuple(q.shape)}")
    if Hq % Hkv:
        raise ValueError(f"{Hq} query heads do not group over {Hkv} KV heads")
    if chunk & (chunk - 1) or D > 512:
        raise ValueError(f"chunk must be a power of two and head_dim at most 512; got {chunk}, {D}")
    if slot_table.shape != chunk_pos.shape or slot_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError("slot_table and chunk_pos must be [B, entries] and seq_lens [B]")
    if out is None:
        out = torch.empty(B, Hq, D, dtype=torch.float32, device=q.device)
    slot_table, chunk_pos = slot_table.to(torch.int32), chunk_pos.to(torch.int32)
    seq_lens = seq_lens.to(torch.int32)
    _pooled_attention_kernel[(B, Hq)](
        q, k_pool, v_pool, out, slot_table, chunk_pos, seq_lens,
        *q.stride(), *k_pool.stride(), *v_pool.stride(), *out.stride(), *slot_table.stride(),
        slot_table.shape[1], D, Hq // Hkv, float(scale), int(window or 0),
        chunk=chunk, BLOCK_D=triton.next_power_of_2(D), HAS_WINDOW=window is not None,
    )
    return out
