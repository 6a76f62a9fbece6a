"""Plain PyTorch reference of chunk_copy: one advanced-index copy per layer."""

from __future__ import annotations

import torch


def _index(cache: torch.Tensor, slots: torch.Tensor):
    """Index of the tokens at ``slots`` in a ``[blocks, kv_heads, block_size, width]`` cache."""
    return slots // cache.shape[2], slice(None), slots % cache.shape[2]


def gather_tokens_naive(caches: list[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
    """[layers, len(slots), kv_heads, width]: every layer's tokens at cache ``slots``."""
    return torch.stack([cache[_index(cache, slots)] for cache in caches])


def scatter_tokens_naive(caches: list[torch.Tensor], slots: torch.Tensor, src: torch.Tensor) -> None:
    """Write ``src`` ([layers, len(slots), kv_heads, width]) into every layer's tokens at ``slots``."""
    for cache, data in zip(caches, src):
        cache[_index(cache, slots)] = data
