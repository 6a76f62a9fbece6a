"""Plain PyTorch reference of chunk_mean, written for clarity rather than speed."""

from __future__ import annotations

import torch


def chunk_mean_naive(keys: torch.Tensor, cu_seqlens: torch.Tensor, chunk_size: int,
                     out_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of `keys` over consecutive chunks of `chunk_size` tokens within each sequence.

    keys: [total_tokens, num_heads, head_dim]; cu_seqlens: [batch + 1] token offsets of the
    sequences (flash-attention varlen layout). Sequence b contributes ceil(len_b / chunk_size)
    chunks; its last chunk averages only the tokens it has, and an empty sequence contributes none.

    Returns (means, cu_chunks): means [total_chunks, num_heads, head_dim] in `out_dtype`, chunks
    laid out sequence after sequence, accumulated in fp32; cu_chunks [batch + 1] chunk offsets of
    the sequences, with the dtype of cu_seqlens, on the device of keys.
    """
    _, num_heads, head_dim = keys.shape
    bounds = cu_seqlens.tolist()
    seq_means = []
    chunk_counts = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        length = end - start
        num_chunks = -(-length // chunk_size)  # ceil division
        chunk_counts.append(num_chunks)
        if num_chunks == 0:
            continue
        # Zero-pad the sequence to whole chunks, sum each chunk, divide by its real token count.
        padded = keys.new_zeros(num_chunks * chunk_size, num_heads, head_dim, dtype=torch.float32)
        padded[:length] = keys[start:end].float()
        sums = padded.view(num_chunks, chunk_size, num_heads, head_dim).sum(dim=1)
        tokens_per_chunk = torch.full((num_chunks,), chunk_size, dtype=torch.float32,
                                      device=keys.device)
        tokens_per_chunk[-1] = length - (num_chunks - 1) * chunk_size
        seq_means.append(sums / tokens_per_chunk[:, None, None])

    if seq_means:
        means = torch.cat(seq_means).to(out_dtype)
    else:
        means = keys.new_empty(0, num_heads, head_dim, dtype=out_dtype)
    cu_chunks = torch.tensor([0] + chunk_counts, dtype=cu_seqlens.dtype,
                             device=keys.device).cumsum(0).to(cu_seqlens.dtype)
    return means, cu_chunks
