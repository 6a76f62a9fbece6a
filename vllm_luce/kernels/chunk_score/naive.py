"""Plain PyTorch references of chunk_score, written for clarity rather than speed."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_luce.kernels.chunk_copy.naive import gather_tokens_naive


def chunk_scores_naive(queries: torch.Tensor, summaries: torch.Tensor) -> torch.Tensor:
    """queries [layers, q_heads, head], summaries [chunks, layers, kv_heads, head] -> [chunks, layers] fp32:
    per layer, the max over query heads of cos(query head, its group's KV-head key summary)."""
    layers, hq, _ = queries.shape
    hkv = summaries.shape[2]
    if hq % hkv:
        raise ValueError(f"chunk_scores: {hq} query heads do not group over {hkv} KV heads")
    keys = summaries.float().repeat_interleave(hq // hkv, dim=2)  # [C, L, Hq, D]
    cos = (F.normalize(queries.float(), dim=-1)[None] * F.normalize(keys, dim=-1)).sum(-1)  # [C, L, Hq]
    return cos.amax(dim=-1)


def key_means_naive(caches: list[torch.Tensor], slots: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[layers, kv_heads, head_dim] fp32: the mean over cache ``slots`` of every layer's keys (the first
    ``head_dim`` elements of each head's row in a ``[blocks, kv_heads, block_size, width]`` cache)."""
    return gather_tokens_naive(caches, slots)[..., :head_dim].float().mean(1)
