"""Triton kernels for KVFlash's key-bounds (``bounds``) residency policy (semantics in naive.py).

``key_bounds``: a full chunk's summary for every pooled layer in one launch, read straight from the
KV caches through the chunk's slots: per page of ``page_tokens`` tokens and KV head, the element-wise
minimum and maximum of the post-RoPE keys, written directly as fp8 e5m2 rounded outward
(``naive.outward_fp8``). One program per (layer, KV head, page); only K is read, nothing is staged.
The fp8 bytes are built with integer arithmetic that restates torch's fp32 -> e5m2 conversion
(round to nearest even, overflow to infinity, NaN kept), so the summary equals the torch path's bit for
bit: Triton's own fp32 -> fp8 cast on Hopper saturates (``cvt.rn.satfinite``), which would turn an
infinite or beyond-range bound into 57344, a bound that no longer bounds. The launch turns off
multiply-add fusion, because torch rounds ``x * 0.75`` before subtracting ``2^-15`` and an FMA would
round once.

``bound_scores``: per (chunk, layer), the max over pages and each group's query heads of
``sum_d max(q_d min_d, q_d max_d) / sqrt(D)``. One program per (block of chunks, layer) decodes each
(KV head, page) fp8 tile once (e5m2 is the top byte of an fp16, so decoding is a shift) and bounds it
against every query head of the group, accumulating in fp32; nothing is converted to an fp32 copy (the
torch path converts the whole stack: 2.4 GB for a Qwen3-8B shape at 128K tokens). As in the torch
path, a page whose sum is NaN (an infinite bound times a zero query element) scores +inf.

Caches are ``kernels.chunk_copy.LayerCaches``: ``[blocks, kv_heads, block_size, width]`` with keys in
the first ``head_dim`` elements of each row, reached through the cache's own strides (vLLM's GPU
layout, NHD or HND, padded blocks). Caches that keep K apart, ``[2, blocks, block_size, kv_heads,
head]``, are passed as their K views ``cache[0].transpose(1, 2)``. Pointer offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import (FLOAT_DTYPES, MAX_HEAD_DIM, autotune, check_device, check_key_read,
                                      chunk_configs, scores_out)
from vllm_luce.kernels.chunk_copy import LayerCaches



@triton.jit
def _e5m2_bits(x):
    """fp32 -> the fp8 e5m2 byte torch's conversion gives (c10 ``fp8e5m2_from_fp32_value``)."""
    bits = x.to(tl.int32, bitcast=True)
    a = bits & 0x7FFFFFFF
    special = tl.where(a > 0x7F800000, 0x7F, 0x7C)  # NaN, else infinity (|x| >= 65536 rounds beyond 57344)
    # below 2^-14 (subnormal in e5m2): adding 2^7 rounds to a multiple of e5m2's spacing 2^-16 in fp32
    tiny = (a.to(tl.float32, bitcast=True) + 128.0).to(tl.int32, bitcast=True) - 0x43000000
    normal = (a - 0x38000000 + 0xFFFFF + ((a >> 21) & 1)) >> 21  # rebias the exponent, round to nearest even
    byte = tl.where(a >= 0x47800000, special, tl.where(a < 0x38800000, tiny, normal))
    return (byte | ((bits >> 24) & 0x80)).to(tl.uint8)


@triton.jit
def _e5m2_value(byte):
    """fp8 e5m2 byte -> fp32, exactly (infinities and NaN included)."""
    return (byte.to(tl.uint16) << 8).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _key_bounds_kernel(cache_base, layer_offsets, slots, out_ptr,
                       block_size, stride_block, stride_head, stride_token, page_tokens, head_dim,
                       stride_ol, stride_op, stride_oh, stride_ob,
                       BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    layer = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    page = tl.program_id(2).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    keys = cache_base + tl.load(layer_offsets + layer) + head * stride_head + dims[None, :]  # K leads the row
    lo = tl.full([BLOCK_D], float("inf"), tl.float32)
    hi = tl.full([BLOCK_D], float("-inf"), tl.float32)
    nan = tl.zeros([BLOCK_D], tl.int32)
    for start in range(0, page_tokens, BLOCK_T):
        tokens = start + tl.arange(0, BLOCK_T)
        token_ok = tokens < page_tokens
        slot = tl.load(slots + page * page_tokens + tokens, mask=token_ok, other=0).to(tl.int64)
        where = (slot // block_size) * stride_block + (slot % block_size) * stride_token
        ok = token_ok[:, None] & dim_ok[None, :]
        k = tl.load(keys + where[:, None], mask=ok, other=0.0).to(tl.float32)
        lo = tl.minimum(lo, tl.min(tl.where(ok, k, float("inf")), axis=0))
        hi = tl.maximum(hi, tl.max(tl.where(ok, k, float("-inf")), axis=0))
        nan = tl.maximum(nan, tl.max((ok & (k != k)).to(tl.int32), axis=0))  # min/max of a NaN is NaN (torch)
    lo = tl.where(nan > 0, float("nan"), lo)
    hi = tl.where(nan > 0, float("nan"), hi)
    # naive.outward_fp8: widen by e5m2's relative spacing 1/4, then by 2^-15 for values below its subnormals
    lo = tl.where(lo > 0, lo * 0.75, lo * 1.25) - 3.0517578125e-05
    hi = tl.where(hi > 0, hi * 1.25, hi * 0.75) + 3.0517578125e-05
    out = out_ptr + layer.to(tl.int64) * stride_ol + page * stride_op + head * stride_oh + dims
    tl.store(out, _e5m2_bits(lo), mask=dim_ok)
    tl.store(out + stride_ob, _e5m2_bits(hi), mask=dim_ok)


@autotune(
    configs=chunk_configs("BLOCK_C"),
    key=["BLOCK_D", "group", "pages"],
)
# The chunk count varies per reselection: not specialized, so the variant the warm-up compiles (one chunk)
# is the one every reselection runs.
@triton.jit(do_not_specialize=["num_chunks"])
def _bound_scores_kernel(
    q_ptr, b_ptr, out_ptr,
    stride_ql, stride_qh, stride_qd,
    stride_bc, stride_bl, stride_bp, stride_bh, stride_bb, stride_bd,
    stride_oc, stride_ol,
    num_chunks, pages, kv_heads, group, head_dim, sqrt_d,
    BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):
    layer = tl.program_id(1).to(tl.int64)
    chunks = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    chunk_ok = chunks < num_chunks
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    ok = chunk_ok[:, None] & dim_ok[None, :]
    rows = b_ptr + chunks[:, None].to(tl.int64) * stride_bc + layer * stride_bl + dims[None, :].to(tl.int64) * stride_bd
    q_row = q_ptr + layer * stride_ql + dims.to(tl.int64) * stride_qd
    best = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for kv_head in range(kv_heads):
        for page in range(pages):
            tile = rows + kv_head * stride_bh + page * stride_bp
            lo = _e5m2_value(tl.load(tile, mask=ok, other=0))
            hi = _e5m2_value(tl.load(tile + stride_bb, mask=ok, other=0))
            for member in range(group):
                head = (kv_head * group + member).to(tl.int64)
                q = tl.load(q_row + head * stride_qh, mask=dim_ok, other=0.0).to(tl.float32)
                # the torch path's two contractions: clamp(q, min=0) . max + clamp(q, max=0) . min
                q_pos = tl.maximum(q, 0.0, propagate_nan=tl.PropagateNan.ALL)
                q_neg = tl.minimum(q, 0.0, propagate_nan=tl.PropagateNan.ALL)
                bound = tl.sum(q_pos[None, :] * hi + q_neg[None, :] * lo, axis=1) / sqrt_d
                best = tl.maximum(best, tl.where(bound != bound, float("inf"), bound))  # NaN: unbounded
    tl.store(out_ptr + chunks.to(tl.int64) * stride_oc + layer * stride_ol, best, mask=chunk_ok)


def key_bounds(caches: LayerCaches, slots: torch.Tensor, head_dim: int, page_tokens: int,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """[layers, pages, kv_heads, 2 (min, max), head_dim] fp8 e5m2 (``out`` if given): per page of
    ``page_tokens`` consecutive ``slots``, the element-wise min and max of each layer's keys per KV head,
    rounded outward (``key_bounds_naive``, bit for bit). One launch for all layers."""
    check_key_read("key_bounds", caches, slots, head_dim)
    if page_tokens <= 0 or len(slots) % page_tokens:
        raise ValueError(f"key_bounds: {len(slots)} slots do not split into pages of {page_tokens} tokens")
    layers, heads, pages = len(caches.caches), caches.heads, len(slots) // page_tokens
    shape = (layers, pages, heads, 2, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=torch.float8_e5m2, device=caches.device)
    elif tuple(out.shape) != shape or out.dtype != torch.float8_e5m2 or out.device != caches.device:
        raise ValueError(f"key_bounds: out must be {list(shape)} float8_e5m2 on {caches.device}, got "
                         f"{list(out.shape)} {out.dtype} on {out.device}")
    block_d = triton.next_power_of_2(head_dim)
    base, out_bytes = caches.base, out.view(torch.uint8)
    _key_bounds_kernel[(layers, heads, pages)](
        base, caches.offsets, slots.to(caches.device), out_bytes, caches.block_size, base.stride(0),
        base.stride(1), base.stride(2), page_tokens, head_dim, *out_bytes.stride()[:4],
        BLOCK_T=max(1, min(triton.next_power_of_2(page_tokens), 4096 // block_d)), BLOCK_D=block_d,
        enable_fp_fusion=False)
    return out


def bound_scores(queries: torch.Tensor, bounds: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """queries [layers, q_heads, head] (fp32/fp16/bf16), bounds [chunks, layers, pages, kv_heads, 2, head]
    fp8 e5m2 (any strides) -> [chunks, layers] fp32 (``out`` if given): per layer, the max over pages and
    each group's query heads of the bound on any of the page's logits (``bound_scores_naive``)."""
    if queries.dim() != 3 or bounds.dim() != 6 or bounds.shape[4] != 2:
        raise ValueError(f"bound_scores: queries must be [layers, q_heads, head] and bounds [chunks, layers, pages, "
                         f"kv_heads, 2, head], got {list(queries.shape)} and {list(bounds.shape)}")
    layers, hq, head_dim = queries.shape
    num_chunks, b_layers, pages, hkv, _, b_dim = bounds.shape
    if (b_layers, b_dim) != (layers, head_dim):
        raise ValueError(f"bound_scores: bounds {list(bounds.shape)} do not match queries {list(queries.shape)} "
                         "in layers and head size")
    if pages == 0:
        raise ValueError("bound_scores: bounds must hold at least one page")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"bound_scores: {hq} query heads do not group over {hkv} KV heads")
    if queries.dtype not in FLOAT_DTYPES or bounds.dtype != torch.float8_e5m2:
        raise TypeError(f"bound_scores: queries must be float32, float16 or bfloat16 and bounds float8_e5m2, got "
                        f"{queries.dtype} and {bounds.dtype}")
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"bound_scores: head size must be 1 to {MAX_HEAD_DIM}, got {head_dim}")
    check_device("bound_scores", queries, bounds)
    out = scores_out("bound_scores", out, num_chunks, layers, queries.device)
    if num_chunks and layers:
        grid = lambda meta: (triton.cdiv(num_chunks, meta["BLOCK_C"]), layers)  # noqa: E731
        b = bounds.view(torch.uint8)  # the same strides: Triton loads the bytes, the kernel decodes them
        _bound_scores_kernel[grid](
            queries, b, out, *queries.stride(), *b.stride(), *out.stride(),
            num_chunks, pages, hkv, hq // hkv, head_dim, float(head_dim) ** 0.5,
            BLOCK_D=triton.next_power_of_2(head_dim))
    return out
