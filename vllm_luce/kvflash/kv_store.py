"""The pager's store over vLLM's paged KV cache (pure torch; no vLLM import).

A request owns the blocks in its block-table row. Pool offset ``f`` of the request is the cache
slot ``row[f // block_size] * block_size + f % block_size``, the same linear slot vLLM's own slot
mapping produces, so the pool works with any block size (chunks need not align with blocks).

Each layer's cache tensor is viewed so that one (block, token) pair indexes one token's K and V
(``TokenLayout``). Chunk data read for paging is ``[layers, tokens, ...]`` in that layout's token
form: bytes exactly as stored, so page-out then page-in is bit-exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TokenLayout:
    """How to address one token in a layer's KV cache tensor.

    ``cpu``: vLLM's CPU backend allocates ``[blocks, kv_heads, block, 2 * head]`` and reads it as
    ``[blocks, kv_heads, 2 (K, V), block, head]``. ``nhd``: FlashAttention / Triton backends,
    ``[2 (K, V), blocks, block, kv_heads, head]``.
    """

    name: str

    def view(self, cache: torch.Tensor, head_size: int) -> torch.Tensor:
        if self.name == "cpu":
            blocks, heads, block, _ = cache.shape
            return cache.view(blocks, heads, 2, block, head_size)
        return cache

    def index(self, blocks: torch.Tensor, offsets: torch.Tensor):
        """Index tuple selecting the given tokens; the result has tokens first for ``cpu`` and second
        (after K/V) for ``nhd``."""
        if self.name == "cpu":
            return blocks, slice(None), slice(None), offsets
        return slice(None), blocks, offsets

    def keys(self, tokens: torch.Tensor) -> torch.Tensor:
        """Keys [tokens, kv_heads, head] of what ``index`` selected."""
        return tokens[:, :, 0] if self.name == "cpu" else tokens[0]

    def block_size(self, view: torch.Tensor) -> int:
        return view.shape[3] if self.name == "cpu" else view.shape[2]


CPU_LAYOUT, NHD_LAYOUT = TokenLayout("cpu"), TokenLayout("nhd")


class PagedPoolStore:
    """One request's pool inside vLLM's KV caches of the pooled layers (all layers at once)."""

    def __init__(self, caches: list[torch.Tensor], layout: TokenLayout, head_size: int, block_size: int,
                 chunk_tokens: int):
        self.views = [layout.view(c, head_size) for c in caches]
        self.layout, self.block_size, self.chunk = layout, block_size, chunk_tokens
        self.cache_block_size = layout.block_size(self.views[0]) if self.views else block_size
        self.row: np.ndarray = np.zeros(0, dtype=np.int64)  # the request's block ids, set every step

    def slots(self, offsets) -> np.ndarray:
        """Linear cache slots of pool offsets (what vLLM's slot mapping holds)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        return self.row[offsets // self.block_size].astype(np.int64) * self.block_size + offsets % self.block_size

    def _index(self, position: int):
        slots = torch.from_numpy(self.slots(np.arange(position * self.chunk, (position + 1) * self.chunk)))
        device = self.views[0].device
        return (slots // self.cache_block_size).to(device), (slots % self.cache_block_size).to(device)

    def _tokens(self, position: int) -> list[torch.Tensor]:
        """Each layer's K and V of the chunk at ``position``, in the layout's token form."""
        index = self.layout.index(*self._index(position))
        return [v[index] for v in self.views]

    def read(self, position: int) -> torch.Tensor:
        return torch.stack(self._tokens(position))

    def read_host(self, position: int) -> torch.Tensor:
        """``read`` copied to host memory (pinned when the cache is on a GPU, for full copy bandwidth)."""
        data = self.read(position)
        if data.device.type == "cpu":
            return data.clone()
        host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
        host.copy_(data)
        return host

    def write(self, position: int, data: torch.Tensor) -> None:
        index = self.layout.index(*self._index(position))
        for v, d in zip(self.views, data):
            v[index] = d.to(v.device, non_blocking=True)

    def rearrange(self, moves, loads) -> None:
        staged = [(dst, self.read(src)) for dst, src in moves]  # read everything before writing
        for dst, data in staged + list(loads):
            self.write(dst, data)

    def summarize(self, position: int) -> torch.Tensor:
        """[layers, kv_heads, head]: mean of the chunk's post-RoPE keys per KV head."""
        return torch.stack([self.layout.keys(t).float().mean(0) for t in self._tokens(position)])
