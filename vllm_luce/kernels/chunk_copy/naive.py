"""Plain PyTorch reference of chunk_copy: one advanced-index copy per layer."""

from __future__ import annotations

import torch


def gather_rows_naive(caches: list[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
    """[layers, 2, len(slots), *row]: K and V rows ``slots`` of every layer's ``[2, rows, *row]`` cache."""
    return torch.stack([cache[:, slots] for cache in caches])


def scatter_rows_naive(caches: list[torch.Tensor], slots: torch.Tensor, src: torch.Tensor) -> None:
    """Write ``src`` ([layers, 2, len(slots), *row]) into rows ``slots`` of every layer's cache."""
    for cache, data in zip(caches, src):
        cache[:, slots] = data
