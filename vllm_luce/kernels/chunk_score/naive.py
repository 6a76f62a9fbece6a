"""Plain PyTorch references of chunk_score, written for clarity rather than speed."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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


def key_means_naive(caches: list[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
    """[layers, kv_heads, head] fp32: the mean over ``slots`` of every layer's keys (``cache[0]`` of a
    ``[2, rows, kv_heads, head]`` cache)."""
    return torch.stack([cache[0, slots].float().mean(0) for cache in caches])
