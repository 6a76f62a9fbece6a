"""Reference semantics of block-sparse causal prefill attention (plain PyTorch, fp32, O(S^2)).

FlashPrefill-style (arXiv 2603.06199): one sequence of S tokens attends causally to itself, but
each query block only reads the key blocks that matter for it.

- Tokens form blocks of ``block_size``; M = ceil(S / block_size) and the last block may be partial.
- ``kmean[n]``: mean of block n's keys over its valid rows, per KV head.
- Block score of query head h, query block m, key block n <= m:
  ``score[h, m, n] = sum_j exp(scale * q_j . kmean_n - rowmax_j)`` over the valid rows j of block m,
  with ``rowmax_j = max_{n' <= m} scale * q_j . kmean_n'`` (query head h reads KV head h // (Hq / Hkv)).
- Block n is kept for (h, m) when n <= m and any of: n < sink_blocks; m - n < window_blocks;
  m >= M - last_full_blocks; score[h, m, n] >= alpha * max_{n' <= m} score[h, m, n'].
- Every query attends causally (by position) to the keys of its block's kept blocks; softmax in fp32.
"""

from __future__ import annotations

import torch


def block_mean_keys_naive(k: torch.Tensor, block_size: int) -> torch.Tensor:
    """k [S, Hkv, D] -> fp32 [M, Hkv, D]: the mean of each block's keys over its valid rows."""
    S, Hkv, D = k.shape
    means = [k[start:start + block_size].float().mean(0) for start in range(0, S, block_size)]
    return torch.stack(means) if means else torch.zeros(0, Hkv, D, device=k.device)


def block_scores_naive(q: torch.Tensor, k_means: torch.Tensor, block_size: int,
                       scale: float | None = None) -> torch.Tensor:
    """q [S, Hq, D], k_means [M, Hkv, D] -> fp32 [Hq, M, M] block scores, 0 where n > m."""
    S, Hq, D = q.shape
    M, Hkv = k_means.shape[:2]
    scale = D ** -0.5 if scale is None else scale
    km = k_means.float().repeat_interleave(Hq // Hkv, dim=1)  # [M, Hq, D]: query head h -> kv head h // group
    logits = scale * torch.einsum("shd,nhd->hsn", q.float(), km)  # [Hq, S, M]
    block_of_row = torch.arange(S, device=q.device) // block_size
    causal = torch.arange(M, device=q.device)[None, :] <= block_of_row[:, None]  # [S, M]
    logits = logits.masked_fill(~causal, float("-inf"))
    weights = torch.exp(logits - logits.amax(-1, keepdim=True))  # exp(-inf) = 0 past the diagonal
    return torch.zeros(Hq, M, M, device=q.device).index_add_(1, block_of_row, weights)  # sum each block's rows


def keep_mask_naive(scores: torch.Tensor, *, sink_blocks: int = 2, window_blocks: int = 4,
                    last_full_blocks: int = 2, alpha: float = 0.12) -> torch.Tensor:
    """scores [Hq, M, M] -> bool [Hq, M, M]: key block n is kept for query block m of head h."""
    Hq, M, _ = scores.shape
    device, scores = scores.device, scores.cpu()
    keep = torch.zeros(Hq, M, M, dtype=torch.bool)
    for h in range(Hq):
        for m in range(M):
            best = max(float(scores[h, m, n]) for n in range(m + 1))
            for n in range(m + 1):
                keep[h, m, n] = (n < sink_blocks or m - n < window_blocks or m >= M - last_full_blocks
                                 or float(scores[h, m, n]) >= alpha * best)
    return keep.to(device)


def block_sparse_attention_naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block_size: int = 128,
                                 sink_blocks: int = 2, window_blocks: int = 4, last_full_blocks: int = 2,
                                 alpha: float = 0.12, scale: float | None = None,
                                 keep: torch.Tensor | None = None) -> torch.Tensor:
    """q [S, Hq, D], k, v [S, Hkv, D] -> fp32 [S, Hq, D].

    ``keep`` ([Hq, M, M] bool) replaces the block selection when given, so a test can check the
    attention given the blocks a kernel selected (scores within rounding of the threshold may flip).
    """
    S, Hq, D = q.shape
    Hkv = k.shape[1]
    scale = D ** -0.5 if scale is None else scale
    if keep is None:
        scores = block_scores_naive(q, block_mean_keys_naive(k, block_size), block_size, scale)
        keep = keep_mask_naive(scores, sink_blocks=sink_blocks, window_blocks=window_blocks,
                               last_full_blocks=last_full_blocks, alpha=alpha)
    pos = torch.arange(S, device=q.device)
    block = pos // block_size
    causal = pos[None, :] <= pos[:, None]  # [query, key]
    visible = keep.to(q.device)[:, block[:, None], block[None, :]] & causal  # [Hq, S, S]
    keys = k.float().repeat_interleave(Hq // Hkv, dim=1).transpose(0, 1)  # [Hq, S, D]
    vals = v.float().repeat_interleave(Hq // Hkv, dim=1).transpose(0, 1)
    logits = scale * q.float().transpose(0, 1) @ keys.transpose(1, 2)  # [Hq, S, S]
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    return (probs @ vals).transpose(0, 1).contiguous()
