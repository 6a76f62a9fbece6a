"""Triton kernels for KVFlash's QK residency policy (semantics in naive.py).

``key_means``: a full chunk's key summary (the mean of its post-RoPE keys per KV head) for every
pooled layer in one launch, read straight from the KV caches through the chunk's slots (one
program per (layer, KV head); only K is read, nothing is staged).

``chunk_scores``: per (chunk, layer), the max over query heads of the cosine between the query head
and its group's key summary. One program per (block of chunks, layer) loads each KV head's summary
tile once and compares it with every query head of the group, so nothing of size query heads x
chunks is materialized (the torch reference repeats the summaries per query head: 4x the bytes for
a 32/8-head model). At 256K tokens a Qwen3-8B-shaped request has 4,096 chunks, 600 MB of fp32
summaries, read once per reselection.

Norms clamp at 1e-12 as ``torch.nn.functional.normalize`` does. Pointer offsets are int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import (FLOAT_DTYPES, MAX_HEAD_DIM, autotune, check_device, check_key_read,
                                      chunk_configs, scores_out)
from vllm_luce.kernels.chunk_copy import LayerCaches



@autotune(
    configs=chunk_configs("BLOCK_C"),
    key=["BLOCK_D", "group"],
)
# The chunk count varies per reselection: not specialized, so the variant the warm-up compiles (one chunk)
# is the one every reselection runs.
@triton.jit(do_not_specialize=["num_chunks"])
def _chunk_scores_kernel(
    q_ptr, k_ptr, out_ptr,
    stride_ql, stride_qh, stride_qd,
    stride_kc, stride_kl, stride_kh, stride_kd,
    stride_oc, stride_ol,
    num_chunks, kv_heads, group, head_dim,
    BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
):
    layer = tl.program_id(1).to(tl.int64)
    chunks = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    chunk_ok = chunks < num_chunks
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    k_rows = k_ptr + chunks[:, None].to(tl.int64) * stride_kc + layer * stride_kl + dims[None, :].to(tl.int64) * stride_kd
    q_row = q_ptr + layer * stride_ql + dims.to(tl.int64) * stride_qd
    best = tl.full([BLOCK_C], float("-inf"), tl.float32)
    for kv_head in range(kv_heads):
        k = tl.load(k_rows + kv_head * stride_kh, mask=chunk_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
        k_inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(k * k, axis=1)), 1e-12)
        for member in range(group):
            head = (kv_head * group + member).to(tl.int64)
            q = tl.load(q_row + head * stride_qh, mask=dim_ok, other=0.0).to(tl.float32)
            q_inv = 1.0 / tl.maximum(tl.sqrt(tl.sum(q * q, axis=0)), 1e-12)
            best = tl.maximum(best, tl.sum(k * q[None, :], axis=1) * (k_inv * q_inv))
    tl.store(out_ptr + chunks.to(tl.int64) * stride_oc + layer * stride_ol, best, mask=chunk_ok)


@triton.jit
def _key_means_kernel(cache_base, layer_offsets, slots, out_ptr,
                      block_size, stride_block, stride_head, stride_token, num_tokens, head_dim,
                      stride_ol, stride_oh, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    layer = tl.program_id(0)
    head = tl.program_id(1).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    dim_ok = dims < head_dim
    keys = cache_base + tl.load(layer_offsets + layer) + head * stride_head + dims[None, :]  # K leads the row
    acc = tl.zeros([BLOCK_T, BLOCK_D], tl.float32)
    for start in range(0, num_tokens, BLOCK_T):
        tokens = start + tl.arange(0, BLOCK_T)
        token_ok = tokens < num_tokens
        slot = tl.load(slots + tokens, mask=token_ok, other=0).to(tl.int64)
        where = (slot // block_size) * stride_block + (slot % block_size) * stride_token
        acc += tl.load(keys + where[:, None], mask=token_ok[:, None] & dim_ok[None, :], other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / num_tokens
    tl.store(out_ptr + layer.to(tl.int64) * stride_ol + head * stride_oh + dims, mean, mask=dim_ok)


def chunk_scores(queries: torch.Tensor, summaries: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """queries [layers, q_heads, head], summaries [chunks, layers, kv_heads, head] (fp32/fp16/bf16, any
    strides) -> [chunks, layers] fp32 (``out`` if given): per layer, the max over query heads of the
    cosine with the group's key summary (``chunk_scores_naive``)."""
    if queries.dim() != 3 or summaries.dim() != 4:
        raise ValueError(f"chunk_scores: queries must be [layers, q_heads, head] and summaries [chunks, layers, "
                         f"kv_heads, head], got {list(queries.shape)} and {list(summaries.shape)}")
    layers, hq, head_dim = queries.shape
    num_chunks, s_layers, hkv, s_dim = summaries.shape
    if (s_layers, s_dim) != (layers, head_dim):
        raise ValueError(f"chunk_scores: summaries {list(summaries.shape)} do not match queries {list(queries.shape)} "
                         "in layers and head size")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"chunk_scores: {hq} query heads do not group over {hkv} KV heads")
    if queries.dtype not in FLOAT_DTYPES or summaries.dtype not in FLOAT_DTYPES:
        raise TypeError(f"chunk_scores: queries and summaries must be float32, float16 or bfloat16, got "
                        f"{queries.dtype} and {summaries.dtype}")
    if not 0 < head_dim <= MAX_HEAD_DIM:
        raise ValueError(f"chunk_scores: head size must be 1 to {MAX_HEAD_DIM}, got {head_dim}")
    check_device("chunk_scores", queries, summaries)
    out = scores_out("chunk_scores", out, num_chunks, layers, queries.device)
    if num_chunks and layers:
        grid = lambda meta: (triton.cdiv(num_chunks, meta["BLOCK_C"]), layers)  # noqa: E731
        _chunk_scores_kernel[grid](
            queries, summaries, out, *queries.stride(), *summaries.stride(), *out.stride(),
            num_chunks, hkv, hq // hkv, head_dim, BLOCK_D=triton.next_power_of_2(head_dim))
    return out


def key_means(caches: LayerCaches, slots: torch.Tensor, head_dim: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """[layers, kv_heads, head_dim] fp32 (``out`` if given): the mean over ``slots`` of each layer's keys,
    the first ``head_dim`` elements of each head's ``[K, V]`` row (``key_means_naive``). One launch for all
    layers."""
    check_key_read("key_means", caches, slots, head_dim)
    layers, heads = len(caches.caches), caches.heads
    if out is None:
        out = torch.empty(layers, heads, head_dim, dtype=torch.float32, device=caches.device)
    elif tuple(out.shape) != (layers, heads, head_dim) or out.dtype != torch.float32 or out.stride(2) != 1:
        raise ValueError(f"key_means: out must be [{layers}, {heads}, {head_dim}] float32 with unit last stride, "
                         f"got {list(out.shape)} {out.dtype} strides {out.stride()}")
    block_d = triton.next_power_of_2(head_dim)
    base = caches.base
    _key_means_kernel[(layers, heads)](
        base, caches.offsets, slots.to(caches.device), out, caches.block_size, base.stride(0), base.stride(1),
        base.stride(2), len(slots), head_dim, out.stride(0), out.stride(1),
        BLOCK_T=max(1, min(32, 4096 // block_d)), BLOCK_D=block_d)
    return out
