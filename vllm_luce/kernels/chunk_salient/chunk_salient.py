"""Triton kernels for KVFlash's salient-key (``salient``) residency policy (semantics and the packed format in
naive.py: two keys per chunk, layer and KV head, their scored dims in int4 with an fp16 scale).

``salient_keys``: a full chunk's summary for every pooled layer in one launch, read straight from the KV caches
through the chunk's slots. One program per (layer, KV head) makes three passes over the chunk's keys in blocks of
tokens: the fp32 sum for the mean; each key's squared distance from it with a running first maximum (key 1); the
minimum of that distance and the distance to key 1, again with a running first maximum (key 2). A NaN distance
counts as +inf, as in the reference. Each chosen key is read once more, its scored dims in (even, odd) pairs, and
packed: the scale rounded to fp16 by the conversion torch uses (nearest even), the quotients correctly rounded
(``div_rn``) and rounded half to even with exact float steps, so the bytes equal the reference's. Only K is read;
nothing is staged. The mean and the distances are fp32 sums in another order than torch's, so a key within
rounding of the farthest one's distance could be chosen instead; the tests use keys with no such near tie.

``salient_scores``: per (chunk, layer), the max over both keys and each KV head's group of query rows of ``q . k /
sqrt(D)``, ``q`` restricted to the scored dims. One program per (block of chunks, layer) decodes each KV head's two
packed keys once and dots them with every query row of the group, accumulating in fp32; a NaN logit scores +inf,
as in the torch path.

Caches are ``kernels.chunk_copy.LayerCaches`` (``[blocks, kv_heads, block_size, width]``, keys in the first
``head_dim`` elements of each row, through the cache's own strides), as for ``chunk_bounds``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import (FLOAT_DTYPES, MAX_HEAD_DIM, autotune, check_device, check_key_read,
                                      chunk_configs, scores_out)
from vllm_luce.kernels.chunk_copy import LayerCaches
from vllm_luce.kernels.chunk_salient.naive import KEYS, row_bytes
from vllm_luce.kernels.scored_dims import ScoredDims


@triton.jit
def _row(slots, token, token_ok, block_size, stride_block, stride_token):
    """Offset of the key row of ``token`` (an index into ``slots``, read where ``token_ok``) from its (layer, KV
    head) base."""
    slot = tl.load(slots + token, mask=token_ok, other=0).to(tl.int64)
    return (slot // block_size) * stride_block + (slot % block_size) * stride_token


@triton.jit
def _key_block(keys, slots, start, num_tokens, block_size, stride_block, stride_token, dims, dim_ok,
               BLOCK_T: tl.constexpr):
    """The keys of tokens ``start`` to ``start + BLOCK_T`` in fp32 ``[BLOCK_T, BLOCK_D]`` (0 past the chunk's end and
    the head's dims), which of those tokens exist, and where both token and dim do."""
    tokens = start + tl.arange(0, BLOCK_T)
    token_ok = tokens < num_tokens
    where = _row(slots, tokens, token_ok, block_size, stride_block, stride_token)
    ok = token_ok[:, None] & dim_ok[None, :]
    return tl.load(keys + where[:, None] + dims[None, :], mask=ok, other=0.0).to(tl.float32), token_ok, ok


@triton.jit
def _first_max(dist, token_ok, start, best, index):
    """One block of a running first maximum over the chunk's tokens: (best, index) after this block's distances. A
    NaN distance counts as +inf, a token past the end as -inf, and an earlier token keeps a tie."""
    dist = tl.where(dist != dist, float("inf"), dist)
    dist = tl.where(token_ok, dist, float("-inf"))
    block_best = tl.max(dist, axis=0)
    block_token = start + tl.argmax(dist, axis=0, tie_break_left=True)
    better = block_best > best  # strictly: an earlier token keeps a tie
    return tl.where(better, block_best, best), tl.where(better, block_token, index)


@triton.jit
def _round_half_even(y):
    """fp32 -> its nearest integer, a half to the even one; floor and the differences are exact in fp32."""
    down = tl.floor(y)
    frac = y - down
    odd = (down - 2.0 * tl.floor(down * 0.5)) != 0.0
    return down + tl.where((frac > 0.5) | ((frac == 0.5) & odd), 1.0, 0.0)


@triton.jit
def _int4(x, s):
    """int32 in [-7, 7]: ``round_half_even(x / s)`` clamped; 0 where the quotient is NaN or the scale 0."""
    y = tl.math.div_rn(x, tl.where(s == 0.0, 1.0, s))
    y = tl.where((y != y) | (s == 0.0), 0.0, y)
    y = tl.minimum(tl.maximum(y, -8.0), 8.0)
    return tl.minimum(tl.maximum(_round_half_even(y), -7.0), 7.0).to(tl.int32)


@triton.jit
def _scored_dim(j, skip, period, kept):
    """The head dim of scored dim ``j``: each ``period`` dims keep their last ``kept`` (``ScoredDims``). A scored pair
    (2i, 2i + 1) is two adjacent head dims: the kept runs are even wherever there are several."""
    return (j // kept) * period + skip + j % kept


@triton.jit
def _pack_key(row, out, skip, period, kept, dims, num_bytes, BLOCK_B: tl.constexpr):
    """Pack the key at pointer ``row`` ([1]): its ``dims`` scored elements, into ``num_bytes`` value bytes at ``out``
    ([1]) and the fp16 scale's two bytes after them."""
    pairs = tl.arange(0, BLOCK_B)[None, :]
    at = row[:, None] + _scored_dim(2 * pairs, skip, period, kept)
    lo = tl.load(at, mask=2 * pairs < dims, other=0.0).to(tl.float32)  # [1, BLOCK_B]
    hi = tl.load(at + 1, mask=2 * pairs + 1 < dims, other=0.0).to(tl.float32)
    nan = tl.sum(((lo != lo) | (hi != hi)).to(tl.int32), axis=1) > 0
    top = tl.max(tl.maximum(tl.where(lo != lo, 0.0, tl.abs(lo)), tl.where(hi != hi, 0.0, tl.abs(hi))), axis=1)
    scale = tl.math.div_rn(tl.where(nan, float("nan"), top), 7.0).to(tl.float16)  # [1]
    s = scale.to(tl.float32)[:, None]
    values = (_int4(lo, s) & 0xF) | ((_int4(hi, s) & 0xF) << 4)
    tl.store(out[:, None] + pairs, values.to(tl.uint8), mask=pairs < num_bytes)
    bits = scale.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    tl.store(out + num_bytes, (bits & 0xFF).to(tl.uint8))
    tl.store(out + num_bytes + 1, (bits >> 8).to(tl.uint8))


@triton.jit
def _salient_keys_kernel(cache_base, layer_offsets, slots, out_ptr,
                         block_size, stride_block, stride_head, stride_token, num_tokens, head_dim, skip, period,
                         kept, stored, num_bytes, stride_ol, stride_oh, stride_ok,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr):
    layer = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    keys = cache_base + tl.load(layer_offsets + layer) + head * stride_head  # K leads the row
    total = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, num_tokens, BLOCK_T):
        k, token_ok, ok = _key_block(keys, slots, start, num_tokens, block_size, stride_block, stride_token, dims,
                                     dim_ok, BLOCK_T)
        total += tl.sum(k, axis=0)
    mean = total / num_tokens
    # Key 1: the first token farthest from the mean.
    best = tl.full([1], float("-inf"), tl.float32)
    first = tl.zeros([1], tl.int32)
    for start in range(0, num_tokens, BLOCK_T):
        k, token_ok, ok = _key_block(keys, slots, start, num_tokens, block_size, stride_block, stride_token, dims,
                                     dim_ok, BLOCK_T)
        diff = tl.where(ok, k - mean[None, :], 0.0)
        best, first = _first_max(tl.sum(diff * diff, axis=1), token_ok, start, best, first)
    first_row = keys + _row(slots, first, first < num_tokens, block_size, stride_block, stride_token)  # [1]
    k1 = tl.load(first_row[:, None] + dims[None, :], mask=dim_ok[None, :], other=0.0).to(tl.float32)  # [1, BLOCK_D]
    # Key 2: the first token farthest from both the mean and key 1 (the smaller of its two distances).
    best = tl.full([1], float("-inf"), tl.float32)
    second = tl.zeros([1], tl.int32)
    for start in range(0, num_tokens, BLOCK_T):
        k, token_ok, ok = _key_block(keys, slots, start, num_tokens, block_size, stride_block, stride_token, dims,
                                     dim_ok, BLOCK_T)
        diff = tl.where(ok, k - mean[None, :], 0.0)
        to_mean = tl.sum(diff * diff, axis=1)
        diff = tl.where(ok, k - k1, 0.0)
        to_first = tl.sum(diff * diff, axis=1)
        nan = (to_mean != to_mean) | (to_first != to_first)  # either NaN: the pair's distance is NaN, so +inf
        best, second = _first_max(tl.where(nan, float("nan"), tl.minimum(to_mean, to_first)), token_ok, start, best,
                                  second)
    second_row = keys + _row(slots, second, second < num_tokens, block_size, stride_block, stride_token)
    out = out_ptr + layer.to(tl.int64) * stride_ol + head * stride_oh + tl.zeros([1], tl.int64)
    _pack_key(first_row, out, skip, period, kept, stored, num_bytes, BLOCK_B)
    _pack_key(second_row, out + stride_ok, skip, period, kept, stored, num_bytes, BLOCK_B)


@triton.jit
def _decoded(at, byte_ok, scale_at, stride_kb, chunk_ok):
    """The low and high values [BLOCK_C, BLOCK_B] of the packed keys whose value bytes are at ``at`` and whose fp16
    scale's bytes are at ``scale_at`` ([BLOCK_C, 1])."""
    values = tl.load(at, mask=byte_ok, other=0).to(tl.int32)
    bits = tl.load(scale_at, mask=chunk_ok, other=0).to(tl.int32) | \
        (tl.load(scale_at + stride_kb, mask=chunk_ok, other=0).to(tl.int32) << 8)
    s = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    lo, hi = values & 0xF, values >> 4
    return (lo - ((lo & 8) << 1)).to(tl.float32) * s, (hi - ((hi & 8) << 1)).to(tl.float32) * s


@autotune(
    configs=chunk_configs("BLOCK_C", without=((64, 8),)),
    key=["BLOCK_B", "group"],
)
# The chunk count varies per reselection: not specialized, so the variant the warm-up compiles (one chunk)
# is the one every reselection runs.
@triton.jit(do_not_specialize=["num_chunks"])
def _salient_scores_kernel(
    q_ptr, k_ptr, out_ptr,
    stride_ql, stride_qh, stride_qd,
    stride_kc, stride_kl, stride_kh, stride_kk, stride_kb,
    stride_oc, stride_ol,
    num_chunks, kv_heads, group, skip, period, kept, dims, num_bytes, sqrt_d,
    BLOCK_C: tl.constexpr, BLOCK_B: tl.constexpr,
):
    layer = tl.program_id(1).to(tl.int64)
    chunks = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    chunk_ok = chunks[:, None] < num_chunks
    pairs = tl.arange(0, BLOCK_B)
    lo_ok, hi_ok = 2 * pairs < dims, 2 * pairs + 1 < dims
    byte_ok = chunk_ok & (pairs[None, :] < num_bytes)
    rows = k_ptr + chunks[:, None].to(tl.int64) * stride_kc + layer * stride_kl  # [BLOCK_C, 1]
    value_at = pairs[None, :].to(tl.int64) * stride_kb
    scale_at = num_bytes * stride_kb
    q_lo = q_ptr + layer * stride_ql + _scored_dim(2 * pairs, skip, period, kept).to(tl.int64) * stride_qd
    best = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for kv_head in range(kv_heads):
        base = rows + kv_head * stride_kh
        lo1, hi1 = _decoded(base + value_at, byte_ok, base + scale_at, stride_kb, chunk_ok)
        lo2, hi2 = _decoded(base + stride_kk + value_at, byte_ok, base + stride_kk + scale_at, stride_kb, chunk_ok)
        for member in range(group):
            head = (kv_head * group + member).to(tl.int64)
            ql = tl.load(q_lo + head * stride_qh, mask=lo_ok, other=0.0).to(tl.float32)[None, :]
            qh = tl.load(q_lo + head * stride_qh + stride_qd, mask=hi_ok, other=0.0).to(tl.float32)[None, :]
            logit1 = tl.sum(ql * lo1 + qh * hi1, axis=1) / sqrt_d
            logit2 = tl.sum(ql * lo2 + qh * hi2, axis=1) / sqrt_d
            best = tl.maximum(best, tl.where(logit1 != logit1, float("inf"), logit1))  # NaN: +inf
            best = tl.maximum(best, tl.where(logit2 != logit2, float("inf"), logit2))
    tl.store(out_ptr + chunks.to(tl.int64) * stride_oc + layer * stride_ol, best, mask=chunks < num_chunks)


def salient_keys(caches: LayerCaches, slots: torch.Tensor, head_dim: int, scored: ScoredDims = ScoredDims(),
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """[layers, kv_heads, 2, row_bytes(scored.count(head_dim))] uint8 (``out`` if given): per layer and KV head, key 1
    and key 2 of the keys at ``slots``, packed (``salient_keys_naive``). One launch for all layers."""
    check_key_read("salient_keys", caches, slots, head_dim)
    scored.check("salient_keys", head_dim)
    stored = scored.count(head_dim)
    layers, heads, num_bytes = len(caches.caches), caches.heads, row_bytes(stored) - 2
    shape = (layers, heads, KEYS, num_bytes + 2)
    if out is None:
        out = torch.empty(shape, dtype=torch.uint8, device=caches.device)
    elif tuple(out.shape) != shape or out.dtype != torch.uint8 or out.device != caches.device:
        raise ValueError(f"salient_keys: out must be {list(shape)} uint8 on {caches.device}, got "
                         f"{list(out.shape)} {out.dtype} on {out.device}")
    if out.stride(3) != 1:
        raise ValueError("salient_keys: out's rows must be contiguous")
    block_d = triton.next_power_of_2(head_dim)
    base = caches.base
    _salient_keys_kernel[(layers, heads)](
        base, caches.offsets, slots.to(caches.device), out, caches.block_size, base.stride(0),
        base.stride(1), base.stride(2), len(slots), head_dim, *scored.runs(head_dim), stored, num_bytes,
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_T=max(1, min(triton.next_power_of_2(len(slots)), 8192 // block_d)), BLOCK_D=block_d,
        BLOCK_B=triton.next_power_of_2(num_bytes))
    return out


def salient_scores(queries: torch.Tensor, summaries: torch.Tensor, scored: ScoredDims = ScoredDims(),
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """queries [layers, q_rows, head] (fp32/fp16/bf16), packed summaries [chunks, layers, kv_heads, 2,
    row_bytes(scored.count(head))] uint8 (any strides) -> [chunks, layers] fp32 (``out`` if given): per layer, the max
    over both keys and each KV head's group of query rows of ``q . k / sqrt(head)`` over the ``scored`` dims
    (``salient_scores_naive``)."""
    if queries.dim() != 3 or summaries.dim() != 5:
        raise ValueError(f"salient_scores: queries must be [layers, q_rows, head] and summaries [chunks, layers, "
                         f"kv_heads, 2, bytes], got {list(queries.shape)} and {list(summaries.shape)}")
    layers, hq, head_dim = queries.shape
    num_chunks, k_layers, hkv, keys, k_bytes = summaries.shape
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"salient_scores: head size must be 1 to {MAX_HEAD_DIM}, got {head_dim}")
    scored.check("salient_scores", head_dim)
    dims = scored.count(head_dim)
    if (k_layers, keys, k_bytes) != (layers, KEYS, row_bytes(dims)):
        raise ValueError(f"salient_scores: summaries {list(summaries.shape)} do not match queries "
                         f"{list(queries.shape)} with scored dims {tuple(scored)} (layers, {KEYS} keys of "
                         f"{row_bytes(dims)} bytes)")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"salient_scores: {hq} query rows do not group over {hkv} KV heads")
    if queries.dtype not in FLOAT_DTYPES or summaries.dtype != torch.uint8:
        raise TypeError(f"salient_scores: queries must be float32, float16 or bfloat16 and summaries uint8, got "
                        f"{queries.dtype} and {summaries.dtype}")
    check_device("salient_scores", queries, summaries)
    out = scores_out("salient_scores", out, num_chunks, layers, queries.device)
    if num_chunks and layers:
        grid = lambda meta: (triton.cdiv(num_chunks, meta["BLOCK_C"]), layers)  # noqa: E731
        _salient_scores_kernel[grid](
            queries, summaries, out, *queries.stride(), *summaries.stride(), *out.stride(),
            num_chunks, hkv, hq // hkv, *scored.runs(head_dim), dims, k_bytes - 2, float(head_dim) ** 0.5,
            BLOCK_B=triton.next_power_of_2(k_bytes - 2))
    return out
