"""Triton kernels: attention over a request's pool slots with a slot -> logical position map, for
decode (one query token per request) and chunked prefill (many). Semantics are in naive.py.

Layout (flash-decoding over a page table):
- `_pooled_fwd`: one program per (request, tile of query tokens, KV head, split of the page table).
  A tile holds every query head of the KV head's GQA group, so each key row is loaded once per group
  and the scores are tensor-core dots: rows = tokens x group heads, padded to 16. The program walks
  its share of the page table BLOCK_N key rows at a time (a chunk is one or more BLOCK_N tiles) and
  keeps an online softmax in fp32, log2 units. Keys are masked by logical position against each
  query row's position (causal, sliding window), so slots relocate freely and stale rows past the
  sequence (rejected drafts) are never seen.
- With one split the program writes the normalized output. With several (decode with few requests,
  so the GPU fills up), it writes unnormalized partials and `_combine_splits` merges them.
Precision: bf16/fp16 dots accumulate in fp32 (P is rounded to the value dtype for P @ V, as in
flash attention); fp32 inputs use IEEE dots. Pointer offsets are int64.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import LOG2E, autotune, dot, is_interpreter, upcast_dots

MAX_HEAD_DIM = 512


@autotune(configs=[triton.Config({}, num_warps=4, num_stages=2), triton.Config({}, num_warps=4, num_stages=3),
                   triton.Config({}, num_warps=8, num_stages=2), triton.Config({}, num_warps=2, num_stages=2),
                   triton.Config({}, num_warps=4, num_stages=1)],
          key=["GROUP", "TOKENS", "BLOCK_M", "BLOCK_N", "BLOCK_D", "CHUNK", "SPLIT", "HAS_WINDOW"])
@triton.jit
def _pooled_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, part_ptr, ml_ptr, slot_ptr, pos_ptr, qstart_ptr, qpos_ptr,
    stride_qn, stride_qh, stride_qd,
    stride_ks, stride_kt, stride_kh, stride_kd,
    stride_vs, stride_vt, stride_vh, stride_vd,
    stride_on, stride_oh, stride_od,
    stride_tb, stride_te,
    q_tiles, num_entries, entries_per_split, head_dim, qk_scale, window,
    GROUP: tl.constexpr, TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr, SPLIT: tl.constexpr, HAS_WINDOW: tl.constexpr,
    IEEE: tl.constexpr, UPCAST: tl.constexpr,
):
    b = tl.program_id(0) // q_tiles
    tile = tl.program_id(0) % q_tiles
    kvh = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2)
    q_lo = tl.load(qstart_ptr + b)
    q_hi = tl.load(qstart_ptr + b + 1)
    first = q_lo + tile * TOKENS
    if first >= q_hi:  # a tile past this request's queries (requests have different lengths)
        return
    rows = tl.arange(0, BLOCK_M)
    tok = (first + rows // GROUP).to(tl.int64)
    head = kvh * GROUP + rows % GROUP
    row_ok = (rows < TOKENS * GROUP) & (tok < q_hi)
    qpos = tl.load(qpos_ptr + tok, mask=row_ok, other=-1)  # a padded row sees nothing
    dims = tl.arange(0, BLOCK_D)
    dmask = dims < head_dim
    q = tl.load(q_ptr + tok[:, None] * stride_qn + head[:, None] * stride_qh + dims[None, :] * stride_qd,
                mask=row_ok[:, None] & dmask[None, :], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    cols = tl.arange(0, BLOCK_N)
    e_lo = split * entries_per_split
    e_hi = tl.minimum(e_lo + entries_per_split, num_entries)
    for it in range(e_lo * SUB, e_hi * SUB):
        e = it // SUB
        row_in_chunk = (it % SUB) * BLOCK_N + cols
        slot = tl.load(slot_ptr + b * stride_tb + e * stride_te).to(tl.int64)
        kpos = tl.load(pos_ptr + b * stride_tb + e * stride_te) + row_in_chunk
        key_ok = row_in_chunk < tl.where(slot >= 0, CHUNK, 0)  # -1 marks an unused page-table entry
        safe_slot = tl.maximum(slot, 0)
        kv_mask = key_ok[:, None] & dmask[None, :]
        k = tl.load(k_ptr + safe_slot * stride_ks + row_in_chunk[:, None].to(tl.int64) * stride_kt
                    + kvh * stride_kh + dims[None, :] * stride_kd, mask=kv_mask, other=0.0)
        visible = key_ok[None, :] & (kpos[None, :] <= qpos[:, None])
        if HAS_WINDOW:
            visible = visible & (kpos[None, :] > qpos[:, None] - window)
        logits = dot(q, tl.trans(k), IEEE, UPCAST) * qk_scale
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(logits, axis=1))
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet stay 0, never NaN
        alpha = tl.exp2(m_i - m_ref)
        p = tl.exp2(logits - m_ref[:, None])
        v = tl.load(v_ptr + safe_slot * stride_vs + row_in_chunk[:, None].to(tl.int64) * stride_vt
                    + kvh * stride_vh + dims[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + dot(p.to(v.dtype), v, IEEE, UPCAST)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
    if SPLIT:  # unnormalized partials [N, Hq, splits, D] and (m, l) [N, Hq, splits, 2]
        n_splits = tl.num_programs(2)
        base = (tok * tl.num_programs(1) * GROUP + head) * n_splits + split
        tl.store(part_ptr + base[:, None] * BLOCK_D + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(ml_ptr + base * 2, m_i, mask=row_ok)
        tl.store(ml_ptr + base * 2 + 1, l_i, mask=row_ok)
    else:
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row that sees nothing is 0
        tl.store(o_ptr + tok[:, None] * stride_on + head[:, None] * stride_oh + dims[None, :] * stride_od,
                 out, mask=row_ok[:, None] & dmask[None, :])


@triton.jit
def _combine_splits(part_ptr, ml_ptr, o_ptr, stride_on, stride_oh, stride_od, num_heads, num_splits, head_dim,
                    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program per (query token, head): merge the splits' partial softmax states."""
    n = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    smask = s < num_splits
    dims = tl.arange(0, BLOCK_D)
    base = (n * num_heads + h) * num_splits + s
    m = tl.load(ml_ptr + base * 2, mask=smask, other=float("-inf"))
    l = tl.load(ml_ptr + base * 2 + 1, mask=smask, other=0.0)
    m_max = tl.max(m, axis=0)
    weight = tl.exp2(m - tl.where(m_max == float("-inf"), 0.0, m_max))
    total = tl.sum(l * weight, axis=0)
    part = tl.load(part_ptr + base[:, None] * BLOCK_D + dims[None, :], mask=smask[:, None], other=0.0)
    out = tl.sum(part * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(o_ptr + n * stride_on + h * stride_oh + dims * stride_od, out, mask=dims < head_dim)


@functools.lru_cache(maxsize=8)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_splits(programs: int, entries: int, device: torch.device) -> int:
    """Splits of the page table so that about two programs per multiprocessor run, each walking at
    least 4 entries; 1 under the interpreter or when the requests already fill the GPU. Two per multiprocessor
    beat one and four in the split sweep (docs/benchmarks.md, "KVFlash pooled attention (GPU)")."""
    if device.type != "cuda" or is_interpreter():
        return 1
    return max(1, min(2 * _multiprocessors(device) // programs, entries // 4))


def _check(q, k_pool, v_pool, slot_table, chunk_pos, batch: int) -> None:
    D = q.shape[-1]
    if v_pool.shape != k_pool.shape or k_pool.dim() != 4 or k_pool.shape[3] != D:
        raise ValueError(f"k_pool {tuple(k_pool.shape)} / v_pool {tuple(v_pool.shape)} do not match q "
                         f"{tuple(q.shape)}: expected [slots, chunk, kv_heads, {D}]")
    if q.shape[-2] % k_pool.shape[2]:
        raise ValueError(f"{q.shape[-2]} query heads do not group over {k_pool.shape[2]} KV heads")
    chunk = k_pool.shape[1]
    if chunk & (chunk - 1) or not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"chunk must be a power of two and head_dim 1..{MAX_HEAD_DIM}; got {chunk}, {D}")
    if q.dtype != k_pool.dtype or k_pool.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"q and the pool must share one float dtype; got {q.dtype} and {k_pool.dtype}")
    if slot_table.shape != chunk_pos.shape or slot_table.dim() != 2 or slot_table.shape[0] != batch:
        raise ValueError(f"slot_table and chunk_pos must both be [{batch}, entries]; got "
                         f"{tuple(slot_table.shape)} and {tuple(chunk_pos.shape)}")


def pooled_attention_varlen(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, query_start_loc: torch.Tensor,
                            q_pos: torch.Tensor, slot_table: torch.Tensor, chunk_pos: torch.Tensor, scale: float,
                            window: int | None = None, out: torch.Tensor | None = None,
                            num_splits: int | None = None, max_query_len: int | None = None,
                            block_n: int | None = None) -> torch.Tensor:
    """Query tokens packed as q ``[N, Hq, D]``, request b's at rows ``query_start_loc[b]:[b + 1]``, at logical
    positions ``q_pos [N]``. Returns fp32 ``[N, Hq, D]`` (or writes ``out``). See naive.py."""
    N, Hq, D = q.shape
    B = query_start_loc.shape[0] - 1
    _check(q, k_pool, v_pool, slot_table, chunk_pos, B)
    if q_pos.shape != (N,):
        raise ValueError(f"q_pos must be [{N}] (one logical position per query token); got {tuple(q_pos.shape)}")
    Hkv, chunk = k_pool.shape[2], k_pool.shape[1]
    group = Hq // Hkv
    if out is None:
        out = torch.empty(N, Hq, D, dtype=torch.float32, device=q.device)
    if N == 0 or B == 0:
        return out
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    block_d = max(16, triton.next_power_of_2(D))
    # key rows per tile, at most one chunk (one slot: contiguous rows): tiles that span chunks through per-row
    # slot lookups are slower at decode and prefill (docs/benchmarks.md, "KVFlash pooled attention (GPU)")
    block_n = min(block_n or (64 if block_d <= 128 else 32 if block_d <= 256 else 16), max(16, chunk))
    # A tile holds whole GQA groups: one token for decode, up to 64 rows (fewer for wide heads) for prefill.
    tokens = max(1, (64 if block_d <= 128 else 32 if block_d <= 256 else 16) // group) if max_query_len > 1 else 1
    block_m = max(16, triton.next_power_of_2(tokens * group))
    q_tiles = triton.cdiv(max(max_query_len, 1), tokens)
    entries = slot_table.shape[1]
    splits = num_splits or default_splits(B * q_tiles * Hkv, entries, q.device)
    splits = max(1, min(splits, entries))
    per_split = triton.cdiv(entries, splits) if entries else 0
    splits = triton.cdiv(entries, per_split) if entries else 1  # no empty split
    part = ml = out  # unused placeholders when there is one split
    if splits > 1:
        part = torch.empty(N, Hq, splits, block_d, dtype=torch.float32, device=q.device)
        ml = torch.empty(N, Hq, splits, 2, dtype=torch.float32, device=q.device)
    slot_table, chunk_pos = slot_table.to(torch.int32), chunk_pos.to(torch.int32)
    query_start_loc, q_pos = query_start_loc.to(torch.int32), q_pos.to(torch.int32)
    _pooled_fwd[(B * q_tiles, Hkv, splits)](
        q, k_pool, v_pool, out, part, ml, slot_table, chunk_pos, query_start_loc, q_pos,
        *q.stride(), *k_pool.stride(), *v_pool.stride(), *out.stride(), *slot_table.stride(),
        q_tiles, entries, per_split, D, float(scale) * LOG2E, int(window or 0),
        GROUP=group, TOKENS=tokens, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, CHUNK=chunk,
        SUB=triton.cdiv(chunk, block_n), SPLIT=splits > 1, HAS_WINDOW=window is not None, IEEE=q.dtype == torch.float32,
        UPCAST=upcast_dots(q.dtype),
    )
    if splits > 1:
        _combine_splits[(N, Hq)](part, ml, out, *out.stride(), Hq, splits, D,
                                 BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=block_d)
    return out


def pooled_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, slot_table: torch.Tensor,
                     chunk_pos: torch.Tensor, seq_lens: torch.Tensor, scale: float, window: int | None = None,
                     out: torch.Tensor | None = None, num_splits: int | None = None,
                     block_n: int | None = None) -> torch.Tensor:
    """Decode: one query token per request, q ``[B, Hq, D]`` at position ``seq_lens - 1``. See naive.py."""
    B = q.shape[0]
    if q.dim() != 3 or seq_lens.shape != (B,):
        raise ValueError(f"decode needs q [B, Hq, D] and seq_lens [B]; got {tuple(q.shape)} and {tuple(seq_lens.shape)}")
    starts = torch.arange(B + 1, dtype=torch.int32, device=q.device)
    return pooled_attention_varlen(q, k_pool, v_pool, starts, seq_lens.to(torch.int32) - 1, slot_table, chunk_pos,
                                   scale, window, out, num_splits, max_query_len=1, block_n=block_n)
