"""Triton kernels: per-key attention scores of the last L prompt queries (PFlash speculative prefill).

Semantics are in naive.py. The [L, S] result is built without any [Hq, L, S] logits in memory:

1. Row statistics: one program per (KV head, row block, key split). Its rows pack the group's
   query heads times the L lookahead rows (GQA: every K tile is loaded once for the whole group);
   it walks its split of keys in BLOCK_N tiles, keeping an online softmax (max and sum) in fp32.
   With one split it writes the log2-sum-exp per (query head, row) directly; otherwise it writes
   partial (max, sum) pairs and a merge kernel (one program per query head) folds the splits.
   Splits keep the pass parallel at long prompts: S = 128K, Hkv = 8 gives 512 programs.
2. Scores: one program per (BLOCK_N key tile, row block). For every KV head it loads the K tile
   once and, for each query head of the group, recomputes the logits (causally masked to -inf, so
   masked keys end at exactly 0) and p = exp2(x - lse); the max over heads is stored into out (or
   max-accumulated into it).

Logits are kept in log2 units (log2(e) folded into the scale), so exp2 needs no extra multiply and
dividing by the softmax sum is part of the exponent. fp32 inputs use exact (non-TF32) dots. Pointer
offsets are int64.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import autotune, is_interpreter
from vllm_luce.kernels.tail_score.naive import check_args

# Keys per split of the statistics pass; sized for ~1 MiB of bf16 K per program at D = 128.
_SPLIT_KEYS = 2048
# At most this many rows (query heads x lookahead rows) per program; 16 is the smallest tl.dot M.
_MAX_ROWS = 64
_MIN_ROWS = 16


def _row_block(rows: int) -> int:
    return max(_MIN_ROWS, min(_MAX_ROWS, triton.next_power_of_2(rows)))


# Both kernels' autotune list over the tile of keys, as (block, warps); the first is the one the CPU interpreter runs.
_KEY_TILES = ((64, 4), (128, 8), (32, 4), (128, 4))


def _key_configs() -> list[triton.Config]:
    return [triton.Config({"BLOCK_N": size}, num_warps=warps) for size, warps in _KEY_TILES]


@autotune(configs=_key_configs(), key=["BLOCK_M", "BLOCK_D"])
@triton.jit(do_not_specialize=["L", "S", "num_splits", "split_keys"])
def _tail_stats_kernel(
    q_ptr, k_ptr, m_ptr, l_ptr,
    stride_ql, stride_qh, stride_qd, stride_ks, stride_kh, stride_kd,
    L, S, head_dim, group, num_splits, split_keys, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
):
    row_blocks = tl.cdiv(group * L, BLOCK_M)
    kvh = tl.program_id(0) // row_blocks
    rows = (tl.program_id(0) % row_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)  # packed (head in group, row)
    split = tl.program_id(1)
    row_ok = rows < group * L
    i = rows % L
    h = (kvh * group + rows // L).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + i[:, None].to(tl.int64) * stride_ql + h[:, None] * stride_qh
                + dims[None, :].to(tl.int64) * stride_qd,
                mask=row_ok[:, None] & (dims < head_dim)[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    last_key = S - L + i  # row i sees keys j <= last_key
    start = split * split_keys
    end = tl.minimum(start + split_keys, S)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    k_base = k_ptr + kvh.to(tl.int64) * stride_kh + dims[:, None].to(tl.int64) * stride_kd
    for tile in range(start, end, BLOCK_N):
        keys = tile + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + keys[None, :].to(tl.int64) * stride_ks,
                     mask=(dims < head_dim)[:, None] & (keys < end)[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
        if UPCAST:
            kt = kt.to(tl.float32)
        x = tl.dot(q, kt, input_precision="ieee") * qk_scale
        visible = (keys[None, :] <= last_key[:, None]) & (keys < end)[None, :]
        x = tl.where(visible, x, float("-inf"))
        m_new = tl.maximum(m, tl.max(x, axis=1))
        # A row with nothing visible yet keeps m = -inf; a 0 pivot avoids inf - inf = NaN.
        pivot = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp2(m - pivot) + tl.sum(tl.exp2(x - pivot[:, None]), axis=1)
        m = m_new
    out_off = h * num_splits * L + split * L + i
    if SINGLE_SPLIT:
        # Key 0 is visible to every row, so l > 0 on real rows; padded rows get a dummy 1.
        tl.store(m_ptr + out_off, m + tl.log2(tl.where(row_ok, l, 1.0)), mask=row_ok)
    else:
        tl.store(m_ptr + out_off, m, mask=row_ok)
        tl.store(l_ptr + out_off, l, mask=row_ok)


@triton.jit(do_not_specialize=["L", "num_splits"])
def _tail_merge_kernel(m_ptr, l_ptr, lse_ptr, L, num_splits, BLOCK_L: tl.constexpr):
    """Folds the per-split (max, sum) of one query head into lse = log2(sum of exp2(logits))."""
    h = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, BLOCK_L)
    ok = i < L
    m = tl.full([BLOCK_L], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_L], tl.float32)
    for split in range(0, num_splits):
        off = h * num_splits * L + split * L + i
        m_s = tl.load(m_ptr + off, mask=ok, other=float("-inf"))
        l_s = tl.load(l_ptr + off, mask=ok, other=0.0)
        m_new = tl.maximum(m, m_s)
        pivot = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp2(m - pivot) + l_s * tl.exp2(m_s - pivot)
        m = m_new
    tl.store(lse_ptr + h * L + i, m + tl.log2(tl.where(ok, l, 1.0)), mask=ok)


@autotune(configs=_key_configs(), key=["BLOCK_L", "BLOCK_D", "ACCUMULATE"])
@triton.jit
def _tail_scores_kernel(
    q_ptr, k_ptr, lse_ptr, out_ptr,
    stride_ql, stride_qh, stride_qd, stride_ks, stride_kh, stride_kd, stride_ol, stride_os,
    L, S, head_dim, num_kv_heads, group, qk_scale,
    BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, ACCUMULATE: tl.constexpr,
    UPCAST: tl.constexpr,
):
    keys = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    i = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    dims = tl.arange(0, BLOCK_D)
    row_ok, key_ok, dim_ok = i < L, keys < S, dims < head_dim
    q_rows = q_ptr + i[:, None].to(tl.int64) * stride_ql + dims[None, :].to(tl.int64) * stride_qd
    k_tile = k_ptr + keys[None, :].to(tl.int64) * stride_ks + dims[:, None].to(tl.int64) * stride_kd
    visible = keys[None, :] <= (S - L + i)[:, None]  # causal tail mask; padded rows are never stored
    best = tl.zeros([BLOCK_L, BLOCK_N], tl.float32)  # masked keys stay exactly 0
    lse_rows = lse_ptr + i
    # Query head h = kvh * group + g runs in order, so the pointers advance head by head.
    for kvh in range(0, num_kv_heads):
        kt = tl.load(k_tile, mask=dim_ok[:, None] & key_ok[None, :], other=0.0)  # [BLOCK_D, BLOCK_N]
        if UPCAST:
            kt = kt.to(tl.float32)
        for g in range(0, group):
            q = tl.load(q_rows, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
            if UPCAST:
                q = q.to(tl.float32)
            lse = tl.load(lse_rows, mask=row_ok, other=0.0)
            x = tl.where(visible, tl.dot(q, kt, input_precision="ieee") * qk_scale, float("-inf"))
            best = tl.maximum(best, tl.exp2(x - lse[:, None]))
            q_rows += stride_qh
            lse_rows += L
        k_tile += stride_kh
    out_ptrs = out_ptr + i[:, None].to(tl.int64) * stride_ol + keys[None, :].to(tl.int64) * stride_os
    store_ok = row_ok[:, None] & key_ok[None, :]
    if ACCUMULATE:
        best = tl.maximum(best, tl.load(out_ptrs, mask=store_ok, other=0.0))
    tl.store(out_ptrs, best, mask=store_ok)


def tail_score(q_tail: torch.Tensor, k: torch.Tensor, *, scale: float | None = None,
               out: torch.Tensor | None = None, accumulate: bool = False) -> torch.Tensor:
    """Triton tail_score (same semantics as tail_score_naive): fp32 [L, S] max-over-heads softmax.

    q_tail [L, Hq, D] and k [S, Hkv, D] share a dtype of fp32/bf16/fp16 (any strides), D <= 256.
    out: optional fp32 [L, S] (any strides), overwritten, or with accumulate=True replaced by
    max(out, result). Three launches at most (stats, split merge when S > _SPLIT_KEYS, scores).
    """
    check_args(q_tail, k, out, accumulate, "tail_score")
    if not k.is_cuda and not is_interpreter():
        raise ValueError(f"tail_score: tensors must be on a CUDA device (got {k.device}); "
                         "CPU tensors run only under TRITON_INTERPRET=1")
    L, Hq, D = q_tail.shape
    S, Hkv, _ = k.shape
    group = Hq // Hkv
    qk_scale = (D ** -0.5 if scale is None else float(scale)) * math.log2(math.e)
    block_d = max(16, triton.next_power_of_2(D))
    if out is None:
        out = torch.empty(L, S, dtype=torch.float32, device=k.device)
    q_strides, k_strides = q_tail.stride(), k.stride()
    # Triton 3.9's interpreter multiplies bf16 dot operands as their raw uint16 bits; fp32 tiles
    # give the same products (bf16 x bf16 is exact in fp32). GPUs keep bf16 tensor-core dots.
    upcast = is_interpreter() and k.dtype == torch.bfloat16

    num_splits = triton.cdiv(S, _SPLIT_KEYS)
    lse = torch.empty(Hq, L, dtype=torch.float32, device=k.device)
    partial_m = lse if num_splits == 1 else torch.empty(Hq, num_splits, L, dtype=torch.float32, device=k.device)
    partial_l = lse if num_splits == 1 else torch.empty_like(partial_m)
    block_m = _row_block(group * L)
    _tail_stats_kernel[(Hkv * triton.cdiv(group * L, block_m), num_splits)](
        q_tail, k, partial_m, partial_l, *q_strides, *k_strides,
        L, S, D, group, num_splits, _SPLIT_KEYS, qk_scale,
        BLOCK_M=block_m, BLOCK_D=block_d, SINGLE_SPLIT=num_splits == 1, UPCAST=upcast,
    )
    if num_splits > 1:
        _tail_merge_kernel[(Hq,)](partial_m, partial_l, lse, L, num_splits, BLOCK_L=triton.next_power_of_2(L))

    block_l = _row_block(L)
    grid = lambda meta: (triton.cdiv(S, meta["BLOCK_N"]), triton.cdiv(L, block_l))  # noqa: E731
    _tail_scores_kernel[grid](
        q_tail, k, lse, out, *q_strides, *k_strides, *out.stride(),
        L, S, D, Hkv, group, qk_scale,
        BLOCK_L=block_l, BLOCK_D=block_d, ACCUMULATE=bool(accumulate), UPCAST=upcast,
    )
    return out
