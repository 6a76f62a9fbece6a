"""Triton kernel: per-chunk mean of keys over variable-length sequences.

The building block of KVFlash's chunk relevance scoring (mean-pooled post-RoPE keys per chunk
per KV head) and of PFlash's block-sparse attention (per-block mean keys). See naive.py for the
reference semantics.

Layout: one program per (chunk, head, head_dim block). The host precomputes a small int32 table
chunk -> (token_start, token_count) with torch ops, so the kernel needs no search over cu_seqlens;
each program streams its chunk's tokens in BLOCK_T-row tiles, accumulates in fp32 and writes one
row of BLOCK_D values. Pointer offsets are computed in int64: 1M tokens x 8 heads x 256 dims
already exceeds int32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import autotune, chunk_configs, is_interpreter

_KEY_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INDEX_DTYPES = (torch.int32, torch.int64)
# 128 lanes cover a head_dim of 128 in one block; larger head dims get more programs instead of
# wider tiles, which keeps register use flat at any chunk size.
_MAX_BLOCK_D = 128


@autotune(
    configs=chunk_configs("BLOCK_T"),
    key=["chunk_size", "head_dim"],
)
@triton.jit
def _chunk_mean_kernel(
    keys_ptr, out_ptr, chunk_table_ptr,
    stride_key_token, stride_key_head, stride_key_dim,
    stride_out_chunk, stride_out_head, stride_out_dim,
    head_dim,
    chunk_size,  # autotune key only: the tile size that wins depends on it
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    chunk = tl.program_id(0)
    head = tl.program_id(1)
    dim_block = tl.program_id(2)

    token_start = tl.load(chunk_table_ptr + 2 * chunk).to(tl.int64)
    token_count = tl.load(chunk_table_ptr + 2 * chunk + 1)

    dims = dim_block * BLOCK_D + tl.arange(0, BLOCK_D)
    dim_mask = dims < head_dim
    row_ptrs = (keys_ptr + head.to(tl.int64) * stride_key_head
                + dims[None, :].to(tl.int64) * stride_key_dim)

    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for tile_start in range(0, token_count, BLOCK_T):
        rows = tile_start + tl.arange(0, BLOCK_T)
        mask = (rows < token_count)[:, None] & dim_mask[None, :]
        ptrs = row_ptrs + (token_start + rows[:, None].to(tl.int64)) * stride_key_token
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)

    mean = tl.sum(acc, axis=0) / token_count.to(tl.float32)
    out_ptrs = (out_ptr + chunk.to(tl.int64) * stride_out_chunk + head.to(tl.int64) * stride_out_head
                + dims.to(tl.int64) * stride_out_dim)
    tl.store(out_ptrs, mean.to(out_ptr.dtype.element_ty), mask=dim_mask)


def _validate(keys: torch.Tensor, cu_seqlens: torch.Tensor, chunk_size: int,
              out_dtype: torch.dtype) -> None:
    if not isinstance(keys, torch.Tensor) or keys.dim() != 3:
        shape = tuple(keys.shape) if isinstance(keys, torch.Tensor) else type(keys).__name__
        raise ValueError(f"chunk_mean: keys must be [total_tokens, num_heads, head_dim], got {shape}")
    if keys.dtype not in _KEY_DTYPES:
        raise TypeError(f"chunk_mean: keys dtype must be float32, float16 or bfloat16, got {keys.dtype}")
    if keys.shape[0] >= 2**31:
        raise ValueError(f"chunk_mean: at most 2**31 - 1 tokens are supported, got {keys.shape[0]}")
    if not keys.is_cuda and not is_interpreter():
        raise ValueError(f"chunk_mean: keys must be on a CUDA device (got {keys.device}); "
                         "CPU tensors run only under TRITON_INTERPRET=1")
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        shape = tuple(cu_seqlens.shape) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
        raise ValueError(f"chunk_mean: cu_seqlens must be a 1-D tensor [batch + 1], got {shape}")
    if cu_seqlens.dtype not in _INDEX_DTYPES:
        raise TypeError(f"chunk_mean: cu_seqlens dtype must be int32 or int64, got {cu_seqlens.dtype}")
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_mean: chunk_size must be a positive int, got {chunk_size!r}")
    if out_dtype not in _KEY_DTYPES:
        raise TypeError(f"chunk_mean: out_dtype must be float32, float16 or bfloat16, got {out_dtype}")


def _chunk_table(cu_seqlens: torch.Tensor, chunk_size: int, total_tokens: int
                 ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Checks cu_seqlens and maps every chunk to (token_start, token_count).

    Returns (cu_chunks int64 [batch + 1], chunk_table int32 [total_chunks, 2], total_chunks).
    One device-to-host sync reads the checks and the chunk count together.
    """
    seq_lens = cu_seqlens[1:] - cu_seqlens[:-1]
    chunks_per_seq = torch.div(seq_lens.clamp(min=0) + chunk_size - 1, chunk_size, rounding_mode="floor")
    cu_chunks = torch.nn.functional.pad(chunks_per_seq.cumsum(0), (1, 0))
    min_len = seq_lens.min() if seq_lens.numel() else cu_seqlens.new_zeros(())
    first, last, shortest, total_chunks = torch.stack(
        [cu_seqlens[0], cu_seqlens[-1], min_len, cu_chunks[-1]]).tolist()
    if first != 0:
        raise ValueError(f"chunk_mean: cu_seqlens must start at 0, got {first}")
    if shortest < 0:
        raise ValueError("chunk_mean: cu_seqlens must be non-decreasing")
    if last != total_tokens:
        raise ValueError(f"chunk_mean: cu_seqlens must end at total_tokens={total_tokens}, got {last}")

    seq_of_chunk = torch.repeat_interleave(chunks_per_seq, output_size=total_chunks)
    chunk_in_seq = torch.arange(total_chunks, device=cu_seqlens.device) - cu_chunks[seq_of_chunk]
    token_start = cu_seqlens[seq_of_chunk] + chunk_in_seq * chunk_size
    token_count = torch.clamp(cu_seqlens[seq_of_chunk + 1] - token_start, max=chunk_size)
    chunk_table = torch.stack([token_start, token_count], dim=1).to(torch.int32)
    return cu_chunks, chunk_table, total_chunks


def chunk_mean(keys: torch.Tensor, cu_seqlens: torch.Tensor, chunk_size: int,
               out_dtype: torch.dtype = torch.float32, out: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-chunk mean of keys over variable-length sequences (same semantics as chunk_mean_naive).

    keys: [total_tokens, num_heads, head_dim] float32/float16/bfloat16, any strides.
    cu_seqlens: int32/int64 [batch + 1], starting at 0, non-decreasing, ending at total_tokens;
    moved to the device of keys if needed.
    chunk_size: any positive int. Sequence b contributes ceil(len_b / chunk_size) chunks.
    out: optional [total_chunks, num_heads, head_dim] tensor of dtype out_dtype (any strides) to
    write into; every element of it is written.

    Returns (means [total_chunks, num_heads, head_dim] in out_dtype, accumulated in fp32;
    cu_chunks [batch + 1] with the dtype of cu_seqlens, on the device of keys).
    Costs one device-to-host sync (the output size depends on cu_seqlens).
    """
    _validate(keys, cu_seqlens, chunk_size, out_dtype)
    total_tokens, num_heads, head_dim = keys.shape
    index_dtype = cu_seqlens.dtype
    cu_seqlens = cu_seqlens.to(device=keys.device, dtype=torch.int64)
    cu_chunks, chunk_table, total_chunks = _chunk_table(cu_seqlens, chunk_size, total_tokens)

    expected_shape = (total_chunks, num_heads, head_dim)
    if out is None:
        out = torch.empty(expected_shape, dtype=out_dtype, device=keys.device)
    elif tuple(out.shape) != expected_shape or out.dtype != out_dtype or out.device != keys.device:
        raise ValueError(f"chunk_mean: out must be {list(expected_shape)} {out_dtype} on {keys.device}, "
                         f"got {list(out.shape)} {out.dtype} on {out.device}")

    if total_chunks > 0 and num_heads > 0 and head_dim > 0:
        block_d = min(triton.next_power_of_2(head_dim), _MAX_BLOCK_D)
        grid = (total_chunks, num_heads, triton.cdiv(head_dim, block_d))
        _chunk_mean_kernel[grid](
            keys, out, chunk_table,
            keys.stride(0), keys.stride(1), keys.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            head_dim, chunk_size,
            BLOCK_D=block_d,
        )
    return out, cu_chunks.to(index_dtype)
