"""The stores a pager reads and rearranges (``PoolStore``; ``TensorStore``, one tensor, for tests and benchmarks),
and the pager's counters (``PagerStats``). Pure torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class PoolStore(Protocol):
    """One request's pool, addressed by pool position (chunk granular)."""

    def read(self, position: int) -> torch.Tensor: ...
    def rearrange(self, moves: list[tuple[int, int]], loads: list[tuple[int, torch.Tensor]]) -> None:
        """Apply all ``(dst, src)`` position moves and ``(dst, data)`` loads as if at once."""
    def summarize(self, position: int) -> torch.Tensor: ...
    def key_bounds(self, position: int, page_tokens: int) -> torch.Tensor: ...
    def capacity(self) -> int:
        """Chunk positions the store has now (the pool's and the cold ones after them)."""
    def chunk_nbytes(self) -> int:
        """Bytes of one chunk paged out to host memory."""


def summarize(policy, store: PoolStore, position: int) -> torch.Tensor:
    """A full chunk's summary in the form ``policy`` scores (its ``summarize``), else the mean key."""
    own = getattr(policy, "summarize", None)
    return own(store, position) if own is not None else store.summarize(position)


class TensorStore:
    """A pool of chunk-sized positions in one tensor ``[positions, ...]`` (tests, benchmarks)."""

    def __init__(self, positions: int, chunk_shape: tuple[int, ...], dtype=torch.bfloat16, device="cpu"):
        self.data = torch.zeros((positions, *chunk_shape), dtype=dtype, device=device)

    def capacity(self) -> int:
        return self.data.shape[0]

    def chunk_nbytes(self) -> int:
        return _nbytes(self.data[0])

    def read(self, position: int) -> torch.Tensor:
        return self.data[position]

    def rearrange(self, moves, loads) -> None:
        sources = [self.data[src].clone() for _, src in moves]  # read everything before writing
        for (dst, _), data in zip(moves, sources):
            self.data[dst].copy_(data)
        for dst, data in loads:
            self.data[dst].copy_(data)

    def summarize(self, position: int) -> torch.Tensor:
        return self.data[position].float().mean(dim=-3)  # mean over the chunk's tokens

    def chunk_keys(self, position: int) -> torch.Tensor:
        return self.data[position]  # [..., tokens, H, D]

    def key_bounds(self, position: int, page_tokens: int) -> torch.Tensor:
        x = self.data[position]  # [..., tokens, H, D] -> [..., pages, H, 2 (min, max), D]
        x = x.unflatten(-3, (-1, page_tokens))
        return torch.stack([x.amin(dim=-3), x.amax(dim=-3)], dim=-2)


def checksum(data: torch.Tensor) -> torch.Tensor:
    """A chunk's bytes as one int64 on their device (``luce.kvflash.verify_pages``): each 32-bit word weighted by its
    place, so that other bytes, or the same bytes in another order (another chunk's, a token moved), sum otherwise."""
    words = data.contiguous().reshape(-1).view(torch.uint8)
    words = words.view(torch.int32) if words.numel() % 4 == 0 else words
    weights = torch.arange(words.numel(), device=words.device, dtype=torch.int64) % 65521 + 1
    return (words.to(torch.int64) * weights).sum()


def paged_in_mismatches(sums: dict[int, torch.Tensor], store, stored_at: dict[int, int], chunks: list[int]) -> int:
    """Of ``chunks`` just paged in, those whose bytes now in the store differ from the checksum taken at their
    page-out (popped from ``sums``); one sync."""
    pairs = [(sums.pop(c), checksum(store.read(stored_at[c]))) for c in chunks if c in sums]
    return int(sum((expected != got).to(torch.int64) for expected, got in pairs)) if pairs else 0


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class PagerStats:
    page_outs: int = 0  # chunks out of the pool, to either tier
    page_ins: int = 0  # chunks back into the pool, from either tier
    cold_outs: int = 0  # of the page-outs, those to cold positions of the store (free KV blocks on the GPU)
    cold_ins: int = 0
    demotions: int = 0  # cold chunks moved to host memory because the scheduler took their KV blocks back
    bytes_out: int = 0  # bytes copied to host memory
    bytes_in: int = 0  # bytes copied back from host memory
    moves: int = 0
    reselections: int = 0
    uncut_decisions: int = 0  # decision positions a step spanned: decided at its start, so its tokens may follow the cut
    dropped: int = 0  # chunks discarded because the host budget was spent (host_full "drop" only)
    lost: int = 0  # chunks of a context found in no tier and not dropped (or in two): a bug, logged where found
    host_over_reserved: int = 0  # host chunks beyond what the scheduler reserved for the request, summed over steps
    page_mismatches: int = 0  # chunks paged back in whose bytes differ from those paged out (verify_pages): a bug
    reselect_s: float = 0.0  # wall time of reselections, scoring and page-ins included
    sparse_steps: int = 0  # SFI: decode steps over the selection
    dense_steps: int = 0  # SFI: decode steps over the whole context (refreshes)
    attended_tokens: int = 0  # SFI: tokens fast steps read, summed (their context: context_tokens)
    context_tokens: int = 0
