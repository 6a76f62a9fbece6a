"""Triton kernels for KVFlash's salient-key (``salient``) residency policy (semantics in naive.py).

``salient_keys``: a full chunk's summary for every pooled layer in one launch, read straight from the KV caches
through the chunk's slots: per KV head, the key farthest from the chunk's mean key, written as fp8 e5m2 (rounded
to nearest even with torch's conversion, ``chunk_bounds._e5m2_bits``). One program per (layer, KV head) makes two
passes over the chunk's keys in blocks of tokens: the fp32 sum for the mean, then each key's squared distance
from it with a running first maximum (a NaN distance counts as +inf, as in the reference); the chosen key is read
once more and written. Only K is read; nothing is staged. The mean and the distances are fp32 sums in another
order than torch's, so a key within rounding of the farthest one's distance could be chosen instead; the tests
use keys with no such near tie.

``salient_scores``: per (chunk, layer), the max over each KV head's group of query rows of ``q . k / sqrt(D)``
with the chunk's salient key. One program per (block of chunks, layer) decodes each KV head's fp8 tile once
(e5m2 is the top byte of an fp16) and dots it with every query row of the group, accumulating in fp32; a NaN
logit scores +inf, as in the torch path.

Caches are ``kernels.chunk_copy.LayerCaches`` (``[blocks, kv_heads, block_size, width]``, keys in the first
``head_dim`` elements of each row, through the cache's own strides), as for ``chunk_bounds``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import FLOAT_DTYPES, MAX_HEAD_DIM, autotune, check_device, check_key_read, scores_out
from vllm_luce.kernels.chunk_bounds.chunk_bounds import _e5m2_bits, _e5m2_value
from vllm_luce.kernels.chunk_copy import LayerCaches



@triton.jit
def _salient_keys_kernel(cache_base, layer_offsets, slots, out_ptr,
                         block_size, stride_block, stride_head, stride_token, num_tokens, head_dim,
                         stride_ol, stride_oh,
                         BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    layer = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    keys = cache_base + tl.load(layer_offsets + layer) + head * stride_head + dims[None, :]  # K leads the row
    total = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, num_tokens, BLOCK_T):
        tokens = start + tl.arange(0, BLOCK_T)
        token_ok = tokens < num_tokens
        slot = tl.load(slots + tokens, mask=token_ok, other=0).to(tl.int64)
        where = (slot // block_size) * stride_block + (slot % block_size) * stride_token
        k = tl.load(keys + where[:, None], mask=token_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
        total += tl.sum(k, axis=0)
    mean = total / num_tokens
    best = tl.full([1], float("-inf"), tl.float32)
    best_token = tl.zeros([1], tl.int32)
    for start in range(0, num_tokens, BLOCK_T):
        tokens = start + tl.arange(0, BLOCK_T)
        token_ok = tokens < num_tokens
        slot = tl.load(slots + tokens, mask=token_ok, other=0).to(tl.int64)
        where = (slot // block_size) * stride_block + (slot % block_size) * stride_token
        ok = token_ok[:, None] & dim_ok[None, :]
        k = tl.load(keys + where[:, None], mask=ok, other=0.0).to(tl.float32)
        diff = tl.where(ok, k - mean[None, :], 0.0)
        dist = tl.sum(diff * diff, axis=1)
        dist = tl.where(dist != dist, float("inf"), dist)  # NaN counts as +inf
        dist = tl.where(token_ok, dist, float("-inf"))
        block_best = tl.max(dist, axis=0)
        block_token = start + tl.argmax(dist, axis=0, tie_break_left=True)
        better = block_best > best  # strictly: an earlier token keeps a tie
        best_token = tl.where(better, block_token, best_token)
        best = tl.where(better, block_best, best)
    slot = tl.load(slots + best_token).to(tl.int64)
    where = (slot // block_size) * stride_block + (slot % block_size) * stride_token
    chosen = tl.load(keys + where[:, None], mask=dim_ok[None, :], other=0.0).to(tl.float32)  # [1, BLOCK_D]
    out = out_ptr + layer.to(tl.int64) * stride_ol + head * stride_oh + dims[None, :]
    tl.store(out, _e5m2_bits(chosen), mask=dim_ok[None, :])


@autotune(
    # The first config is the one the CPU interpreter runs.
    configs=[
        triton.Config({"BLOCK_C": 32}, num_warps=4),
        triton.Config({"BLOCK_C": 64}, num_warps=4),
        triton.Config({"BLOCK_C": 16}, num_warps=2),
        triton.Config({"BLOCK_C": 128}, num_warps=8),
    ],
    key=["BLOCK_D", "group"],
)
@triton.jit
def _salient_scores_kernel(
    q_ptr, k_ptr, out_ptr,
    stride_ql, stride_qh, stride_qd,
    stride_kc, stride_kl, stride_kh, stride_kd,
    stride_oc, stride_ol,
    num_chunks, kv_heads, group, head_dim, sqrt_d,
    BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):
    layer = tl.program_id(1).to(tl.int64)
    chunks = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    chunk_ok = chunks < num_chunks
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    ok = chunk_ok[:, None] & dim_ok[None, :]
    rows = k_ptr + chunks[:, None].to(tl.int64) * stride_kc + layer * stride_kl + dims[None, :].to(tl.int64) * stride_kd
    q_row = q_ptr + layer * stride_ql + dims.to(tl.int64) * stride_qd
    best = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for kv_head in range(kv_heads):
        k = _e5m2_value(tl.load(rows + kv_head * stride_kh, mask=ok, other=0))
        for member in range(group):
            head = (kv_head * group + member).to(tl.int64)
            q = tl.load(q_row + head * stride_qh, mask=dim_ok, other=0.0).to(tl.float32)
            logit = tl.sum(q[None, :] * k, axis=1) / sqrt_d
            best = tl.maximum(best, tl.where(logit != logit, float("inf"), logit))  # NaN: +inf
    tl.store(out_ptr + chunks.to(tl.int64) * stride_oc + layer * stride_ol, best, mask=chunk_ok)


def salient_keys(caches: LayerCaches, slots: torch.Tensor, head_dim: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """[layers, kv_heads, head_dim] fp8 e5m2 (``out`` if given): per layer and KV head, the key at ``slots``
    farthest from their mean key (``salient_keys_naive``). One launch for all layers."""
    check_key_read("salient_keys", caches, slots, head_dim)
    layers, heads = len(caches.caches), caches.heads
    shape = (layers, heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=torch.float8_e5m2, device=caches.device)
    elif tuple(out.shape) != shape or out.dtype != torch.float8_e5m2 or out.device != caches.device:
        raise ValueError(f"salient_keys: out must be {list(shape)} float8_e5m2 on {caches.device}, got "
                         f"{list(out.shape)} {out.dtype} on {out.device}")
    block_d = triton.next_power_of_2(head_dim)
    base, out_bytes = caches.base, out.view(torch.uint8)
    _salient_keys_kernel[(layers, heads)](
        base, caches.offsets, slots.to(caches.device), out_bytes, caches.block_size, base.stride(0),
        base.stride(1), base.stride(2), len(slots), head_dim, out_bytes.stride(0), out_bytes.stride(1),
        BLOCK_T=max(1, min(triton.next_power_of_2(len(slots)), 8192 // block_d)), BLOCK_D=block_d)
    return out


def salient_scores(queries: torch.Tensor, keys: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """queries [layers, q_rows, head] (fp32/fp16/bf16), salient keys [chunks, layers, kv_heads, head] fp8 e5m2 (any
    strides) -> [chunks, layers] fp32 (``out`` if given): per layer, the max over each KV head's group of query
    rows of ``q . k / sqrt(head)`` (``salient_scores_naive``)."""
    if queries.dim() != 3 or keys.dim() != 4:
        raise ValueError(f"salient_scores: queries must be [layers, q_rows, head] and keys [chunks, layers, kv_heads, "
                         f"head], got {list(queries.shape)} and {list(keys.shape)}")
    layers, hq, head_dim = queries.shape
    num_chunks, k_layers, hkv, k_dim = keys.shape
    if (k_layers, k_dim) != (layers, head_dim):
        raise ValueError(f"salient_scores: keys {list(keys.shape)} do not match queries {list(queries.shape)} in "
                         "layers and head size")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"salient_scores: {hq} query rows do not group over {hkv} KV heads")
    if queries.dtype not in FLOAT_DTYPES or keys.dtype != torch.float8_e5m2:
        raise TypeError(f"salient_scores: queries must be float32, float16 or bfloat16 and keys float8_e5m2, got "
                        f"{queries.dtype} and {keys.dtype}")
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"salient_scores: head size must be 1 to {MAX_HEAD_DIM}, got {head_dim}")
    check_device("salient_scores", queries, keys)
    out = scores_out("salient_scores", out, num_chunks, layers, queries.device)
    if num_chunks and layers:
        grid = lambda meta: (triton.cdiv(num_chunks, meta["BLOCK_C"]), layers)  # noqa: E731
        k = keys.view(torch.uint8)  # the same strides: Triton loads the bytes, the kernel decodes them
        _salient_scores_kernel[grid](
            queries, k, out, *queries.stride(), *k.stride(), *out.stride(),
            num_chunks, hkv, hq // hkv, head_dim, float(head_dim) ** 0.5, BLOCK_D=triton.next_power_of_2(head_dim))
    return out
