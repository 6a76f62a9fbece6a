"""Triton kernel: causal prefill attention over the kept key blocks only (semantics in naive.py).

Layout: one program per (query head, tile of BLOCK_M query rows), heads fastest and the last query
tiles (most key blocks) first. BLOCK_M and BLOCK_N are clamped to block_size, so a 128-token query
block may run as two 64-row tiles sharing one row of the index table. Each program walks that
row's kept blocks:
- the off-diagonal blocks (all entries but the last, ascending, so n < m) are whole blocks: one flat
  loop over (entry, BLOCK_N sub-tile) with no masks but head_dim, which the compiler can pipeline;
- then the diagonal block m (always kept, always last) up to the tile's last row, masked causally
  by position and by the sequence end (the last block may be partial).
Online softmax in fp32 with exp2 and log2(e) folded into the scale; tl.dot accumulates in fp32
(IEEE for fp32 inputs, not tf32). Head dims are padded to a power-of-two BLOCK_D >= 16 with masks.
Pointer offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import autotune, dot
from vllm_luce.kernels.block_sparse_attention.block_select import (
    LOG2E, block_mean_keys, check_block_size, check_qkv, check_scale, check_selection, query_tile, select_blocks,
    upcast_dots)


@triton.jit
def _attend(q, k_base, v_base, stride_kt, stride_vt, cols, dims, dmask, kv_mask, visible, m_i, l_i, acc, qk_scale,
            MASKED: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """One online-softmax step over the keys `cols` (visible[row, col] applies when MASKED)."""
    k = tl.load(k_base + cols[None, :].to(tl.int64) * stride_kt, mask=kv_mask[None, :] & dmask[:, None], other=0.0)
    logits = dot(q, k, IEEE, UPCAST) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    if MASKED:
        logits = tl.where(visible, logits, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(logits, axis=1))
    correction = tl.exp2(m_i - m_new)
    p = tl.exp2(logits - m_new[:, None])
    v = tl.load(v_base + cols[:, None].to(tl.int64) * stride_vt, mask=kv_mask[:, None] & dmask[None, :], other=0.0)
    acc = acc * correction[:, None] + dot(p.to(v.dtype), v, IEEE, UPCAST)
    return m_new, l_i * correction + tl.sum(p, axis=1), acc


_CONFIGS = [  # the first is the interpreter's and a sound H100 default for D = 128
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4, num_stages=2),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 32}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32}, num_warps=4, num_stages=4),
]


@autotune(configs=_CONFIGS, key=["BLOCK_SIZE", "BLOCK_D", "IEEE"])
@triton.heuristics({"BLOCK_M": lambda a: min(a["BLOCK_M"], a["BLOCK_SIZE"]),
                    "BLOCK_N": lambda a: min(a["BLOCK_N"], a["BLOCK_SIZE"])})
@triton.jit(do_not_specialize=["seq_len"])
def _sparse_attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, index_ptr, count_ptr,
    stride_qt, stride_qh, stride_qd, stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_ot, stride_oh, stride_od, stride_ih, stride_im, stride_in, stride_ch, stride_cm,
    seq_len, head_dim, group, qk_scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, IEEE: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    head, row0, rows, rmask, dims, dmask, q = query_tile(q_ptr, stride_qt, stride_qh, stride_qd, seq_len, head_dim,
                                                         BLOCK_M, BLOCK_D)
    kv_head = head // group
    m = row0 // BLOCK_SIZE
    k_base = k_ptr + kv_head * stride_kh + dims[:, None].to(tl.int64) * stride_kd  # K^T tiles [BLOCK_D, BLOCK_N]
    v_base = v_ptr + kv_head * stride_vh + dims[None, :].to(tl.int64) * stride_vd  # V tiles [BLOCK_N, BLOCK_D]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    all_keys = tl.full([BLOCK_N], 1, dtype=tl.int1)
    entries = index_ptr + head * stride_ih + m.to(tl.int64) * stride_im
    count = tl.load(count_ptr + head * stride_ch + m.to(tl.int64) * stride_cm)

    TILES: tl.constexpr = BLOCK_SIZE // BLOCK_N
    for step in range(0, (count - 1) * TILES):  # whole blocks n < m: no masks
        block = tl.load(entries + (step // TILES) * stride_in)
        cols = block * BLOCK_SIZE + (step % TILES) * BLOCK_N + tl.arange(0, BLOCK_N)
        m_i, l_i, acc = _attend(q, k_base, v_base, stride_kt, stride_vt, cols, dims, dmask, all_keys, all_keys,
                                m_i, l_i, acc, qk_scale, False, IEEE, UPCAST)
    # The diagonal block: causal by position; every valid row sees its block's first key, so m_i turns finite.
    for start in range(m * BLOCK_SIZE, tl.minimum(row0 + BLOCK_M, seq_len), BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        in_seq = cols < seq_len
        visible = (cols[None, :] <= rows[:, None]) & in_seq[None, :]
        m_i, l_i, acc = _attend(q, k_base, v_base, stride_kt, stride_vt, cols, dims, dmask, in_seq, visible,
                                m_i, l_i, acc, qk_scale, True, IEEE, UPCAST)

    out = acc / l_i[:, None]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_ot + head * stride_oh
             + dims[None, :].to(tl.int64) * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=rmask[:, None] & dmask[None, :])


def _check_out(name: str, out: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor:
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        got = f"{list(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise ValueError(f"{name}: out must be {list(q.shape)} {q.dtype} on {q.device}, got {got}")
    return out


def sparse_attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor,
                             counts: torch.Tensor, *, block_size: int, scale: float | None = None,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """The attention given a kept-block table in select_blocks' format: int32 indices [Hq, M, M]
    whose row (h, m) lists counts[h, m] >= 1 blocks ascending, the last one m (any strides)."""
    name = "sparse_attention_forward"
    check_qkv(name, q, k, v)
    check_block_size(name, block_size)
    check_scale(name, scale)
    S, Hq, D = q.shape
    M = triton.cdiv(S, block_size)
    if indices.shape != (Hq, M, M) or counts.shape != (Hq, M) or indices.dtype != torch.int32 \
            or counts.dtype != torch.int32 or indices.device != q.device or counts.device != q.device:
        raise ValueError(f"{name}: indices must be int32 [{Hq}, {M}, {M}] and counts int32 [{Hq}, {M}] on {q.device}, "
                         f"got {indices.dtype} {list(indices.shape)} and {counts.dtype} {list(counts.shape)}")
    out = _check_out(name, out, q)
    if S == 0:
        return out
    scale = D ** -0.5 if scale is None else float(scale)
    grid = lambda meta: (Hq, triton.cdiv(S, meta["BLOCK_M"]))  # noqa: E731
    _sparse_attention_kernel[grid](
        q, k, v, out, indices, counts, *q.stride(), *k.stride(), *v.stride(), *out.stride(),
        *indices.stride(), *counts.stride(), S, D, Hq // k.shape[1], scale * LOG2E,
        BLOCK_SIZE=block_size, BLOCK_D=max(16, triton.next_power_of_2(D)), IEEE=q.dtype == torch.float32,
        UPCAST=upcast_dots(q.dtype))
    return out


def kept_fraction(counts: torch.Tensor) -> float:
    """Kept (head, query block, key block) triples over the causal ones: counts [Hq, M] -> float (syncs)."""
    Hq, M = counts.shape
    return float(counts.sum()) / (Hq * M * (M + 1) / 2) if M else 1.0


def block_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_size: int = 128,
                           sink_blocks: int = 2, window_blocks: int = 4, last_full_blocks: int = 2,
                           alpha: float = 0.12, scale: float | None = None, out: torch.Tensor | None = None,
                           return_density: bool = False) -> torch.Tensor | tuple[torch.Tensor, float]:
    """Block-sparse causal prefill attention of one sequence (semantics in naive.py).

    q [S, Hq, D], k, v [S, Hkv, D]: one dtype (fp32/bf16/fp16), any strides, Hq % Hkv == 0, D <= 256.
    scale defaults to D ** -0.5. out: optional [S, Hq, D] tensor of q's dtype (any strides), fully
    written. Returns out, or (out, kept_fraction) with return_density=True (one host sync).
    Memory beyond q/k/v/out: O(S) plus the [Hq, M, M] score and index tables, M = ceil(S / block_size).
    """
    name = "block_sparse_attention"
    check_qkv(name, q, k, v)
    check_block_size(name, block_size)
    check_selection(name, sink_blocks, window_blocks, last_full_blocks, alpha, scale)
    out = _check_out(name, out, q)
    indices, counts = select_blocks(q, block_mean_keys(k, block_size), block_size=block_size,
                                    sink_blocks=sink_blocks, window_blocks=window_blocks,
                                    last_full_blocks=last_full_blocks, alpha=alpha, scale=scale)
    sparse_attention_forward(q, k, v, indices, counts, block_size=block_size, scale=scale, out=out)
    return (out, kept_fraction(counts)) if return_density else out
