"""The pager's store over vLLM's paged KV cache (pure torch; no vLLM import).

A request owns the blocks in its block-table row. Pool offset ``f`` of the request is the cache
slot ``row[f // block_size] * block_size + f % block_size``, the same linear slot vLLM's own slot
mapping produces, so the pool works with any block size (chunks need not align with blocks).

Both layouts are a layer tensor ``[blocks, kv_heads, block_size, 2 * head]``; ``TokenLayout`` says
where one token's K and V are in it. Chunk data read for paging is ``[layers, tokens, ...]`` in the
layout's token form: bytes exactly as stored, so page-out then page-in is bit-exact.

On a GPU, host copies run on a side stream. Page-out gathers the chunk into a staging tensor on the
compute stream (so the slot may be overwritten right after) and copies it to pinned host memory on
the copy stream, which the compute stream never waits for. Page-in copies host to device on the
copy stream (after any page-out still in flight, by stream order) and the compute stream waits for
that copy before scattering. On a GPU every layer's tokens move in one Triton launch
(``kernels.chunk_copy``) instead of one or two launches per layer, which left paging launch-bound.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np
import torch

from vllm_luce.kernels.scored_dims import ScoredDims


@dataclass(frozen=True)
class TokenLayout:
    """How to address one token in a layer's KV cache tensor ``[blocks, kv_heads, block_size, 2 * head]``.

    ``packed``: vLLM's GPU backends (FLASH_ATTN, TRITON_ATTN, FLASHINFER): token ``t`` of a block is
    ``[:, t, :head]`` (K) and ``[:, t, head:]`` (V), whatever the stride order (NHD or HND) or block
    padding. Token form ``[T, kv_heads, 2 * head]``.

    ``cpu``: vLLM's CPU backend; inside one (block, KV head) region its kernels place elements by ISA:
    the ``vec`` kernels store K transposed (``[head, block]``) and V by token; ``amx`` interleaves pairs.
    ``elements`` ([block, 2 * head], found by writing probe values through vLLM's own kernel,
    ``cache_layout.probe_cpu_elements``) gives where token ``t``'s K (then V) elements are; ``None`` means K
    then V by token, row-major. Token form ``[T, kv_heads, 2, head]``.
    """

    name: str
    elements: torch.Tensor | None = field(default=None, compare=False)

    def with_elements(self, elements: torch.Tensor) -> "TokenLayout":
        return TokenLayout(self.name, elements)


def _identity_elements(block: int, head: int) -> torch.Tensor:
    """[block, 2 * head]: K of token t at t * head + d, V after all K."""
    t, d = torch.arange(block)[:, None], torch.arange(head)[None, :]
    return torch.cat([t * head + d, block * head + t * head + d], dim=1)


CPU_LAYOUT, PACKED_LAYOUT = TokenLayout("cpu"), TokenLayout("packed")


def _mover(caches: list[torch.Tensor]):
    """One-launch gather/scatter over every layer's cache on a GPU; None where the per-layer torch copies
    run instead (CPU, caches that differ in strides)."""
    if not caches or caches[0].device.type != "cuda":
        return None
    from vllm_luce.kernels.chunk_copy import LayerCaches  # imports Triton: GPU only

    try:
        return LayerCaches(caches)
    except ValueError:
        return None


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device``. On a GPU the copy is queued from pinned memory: a pageable
    copy would stall the host until the compute stream drains."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


@functools.lru_cache(maxsize=None)
def copy_stream_for(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every request's page-outs (device to host)."""
    return torch.cuda.Stream(device)


@functools.lru_cache(maxsize=None)
def load_stream_for(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for page-ins (host to device). On the page-outs' stream a page-in queued behind
    every page-out before it, and the step waited for them all: a prompt-end reselection behind a long prompt's
    page-outs took several times its own scoring and paging (docs/benchmarks.md, "Measurements behind design
    choices in the code")."""
    return torch.cuda.Stream(device)


class PagedPoolStore:
    """One request's pool inside vLLM's KV caches of the pooled layers (all layers at once)."""

    def __init__(self, caches: list[torch.Tensor], layout: TokenLayout, head_size: int, block_size: int,
                 chunk_tokens: int):
        self.layout, self.block_size, self.chunk, self.head = layout, block_size, chunk_tokens, head_size
        self.cache_block_size = caches[0].shape[2] if caches else block_size
        self.elements = None
        if layout.name == "cpu":  # one flat (block, KV head) region per index pair; tokens through ``elements``
            self.views = [c.view(c.shape[0], c.shape[1], -1) for c in caches]
            elements = layout.elements if layout.elements is not None else \
                _identity_elements(self.cache_block_size, head_size)
            self.elements = elements.to(self.views[0].device) if self.views else elements
            self.mover = None
        else:
            self.views = list(caches)
            self.mover = _mover(self.views)
        self.row: np.ndarray = np.zeros(0, dtype=np.int64)  # the request's block ids, set every step
        self.device = self.views[0].device if self.views else torch.device("cpu")
        self.copy_stream = copy_stream_for(self.device) if self.device.type == "cuda" else None
        self.load_stream = load_stream_for(self.device) if self.device.type == "cuda" else None
        self.host_pool = None  # (shape, dtype) -> a PinnedChunkPool for page-outs (the runtime's, shared)

    def capacity(self) -> int:
        """Chunk positions the request's block row holds now: the pool's, then cold ones in blocks beyond it."""
        return len(self.row) * self.block_size // self.chunk

    def chunk_nbytes(self) -> int:
        """Bytes of one chunk of every pooled layer's K and V (what a page-out copies to host memory)."""
        if not self.views:
            return 0
        return len(self.views) * self.chunk * self.views[0].shape[1] * 2 * self.head * self.views[0].element_size()

    def slots(self, offsets) -> np.ndarray:
        """Linear cache slots of pool offsets (what vLLM's slot mapping holds)."""
        offsets = np.asarray(offsets, dtype=np.int64)
        return self.row[offsets // self.block_size].astype(np.int64) * self.block_size + offsets % self.block_size

    def _cache_slots(self, position: int) -> torch.Tensor:
        return self._device_slots(np.arange(position * self.chunk, (position + 1) * self.chunk))

    def _device_slots(self, offsets: np.ndarray) -> torch.Tensor:
        """Cache slots of pool offsets on the cache's device (``to_device_async``)."""
        return to_device_async(torch.from_numpy(self.slots(offsets)), self.device)

    def _index(self, slots: torch.Tensor):
        """Index tuple of the tokens at cache ``slots``: ``[T, heads, 2 * head]`` (packed),
        ``[T, 2 * head, heads]`` through the element map (cpu)."""
        blocks, offsets = slots // self.cache_block_size, slots % self.cache_block_size
        if self.elements is None:
            return blocks, slice(None), offsets
        return blocks[:, None], slice(None), self.elements[offsets]

    def _gather(self, slots: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's K and V at cache ``slots``, in the layout's token form."""
        if self.mover is not None:
            return list(self.mover.gather(slots))
        index = self._index(slots)
        if self.elements is None:
            return [v[index] for v in self.views]
        return [v[index].transpose(1, 2).reshape(len(slots), v.shape[1], 2, self.head) for v in self.views]

    def _scatter(self, slots: torch.Tensor, data: torch.Tensor) -> None:
        if self.mover is not None:
            self.mover.scatter(slots, data)
            return
        index = self._index(slots)
        for v, d in zip(self.views, data):
            v[index] = d if self.elements is None else d.reshape(len(slots), v.shape[1], 2 * self.head).transpose(1, 2)

    def _tokens(self, position: int) -> list[torch.Tensor]:
        """Each layer's K and V of the chunk at ``position``, in the layout's token form."""
        return self._gather(self._cache_slots(position))

    def read(self, position: int) -> torch.Tensor:
        return self._read_slots(self._cache_slots(position))

    def _read_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """[layers, len(slots), ...]: every layer's K and V at cache ``slots``, one fresh tensor."""
        if self.mover is not None:
            return self.mover.gather(slots)
        return torch.stack(self._gather(slots))

    def read_host(self, position: int) -> torch.Tensor:
        """``read`` copied to host memory: pinned and on the copy stream when the cache is on a GPU."""
        data = self.read(position)  # a fresh tensor: the slot may be overwritten once this is queued
        if self.copy_stream is None:
            return data
        pool = self.host_pool(tuple(data.shape), data.dtype) if self.host_pool is not None else None
        host = pool.take() if pool is not None else None
        pinned = host is not None
        if not pinned:  # every pinned view is in use: pageable memory, copied now (never pinned while serving)
            host = torch.empty(data.shape, dtype=data.dtype)
        self.copy_stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.copy_stream):
            host.copy_(data, non_blocking=pinned)
        data.record_stream(self.copy_stream)  # the staging tensor outlives the copy
        host.luce_written = torch.cuda.Event()  # a page-in of these bytes waits for this copy, not all of them
        host.luce_written.record(self.copy_stream)
        return host

    def settle(self) -> None:
        """Wait for the work already queued on the device (the step before this one, under asynchronous
        scheduling), so that a reselection's time is its own: its scores' copy to the host would wait anyway."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def synchronize(self) -> None:
        """Wait for host copies in flight (before reading paged-out bytes on the host)."""
        if self.copy_stream is not None:
            self.copy_stream.synchronize()

    def _to_device(self, data: torch.Tensor) -> torch.Tensor:
        """Host bytes on the device, copied on the page-in stream once their own page-out has landed (the step then
        waits for this copy only). The page-outs' stream then waits for it too: a host view goes back to its pool
        after an event on that stream, and must not be reused while this copy still reads it."""
        if data.device == self.device:
            return data
        if self.copy_stream is None:
            return data.to(self.device)
        written = getattr(data, "luce_written", None)
        if written is not None:
            self.load_stream.wait_event(written)
        else:  # bytes from elsewhere: after every page-out so far
            self.load_stream.wait_stream(self.copy_stream)
        with torch.cuda.stream(self.load_stream):
            staged = data.to(self.device, non_blocking=True)
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.load_stream)
        self.copy_stream.wait_stream(self.load_stream)
        staged.record_stream(current)
        return staged

    def write(self, position: int, data: torch.Tensor) -> None:
        self._scatter(self._cache_slots(position), self._to_device(data))

    def rearrange(self, moves, loads) -> None:
        """Moves ``(dst, src)`` as one gather of every source chunk, then one scatter, then the loads. Per chunk, a
        move cost two launches and two slot copies, which made an eviction that shifts the compacted pool a
        host-bound step (docs/benchmarks.md, "Measurements behind design choices in the code")."""
        if moves:
            data = self._read_slots(self._device_slots(self._chunk_offsets([src for _, src in moves])))
            self._scatter(self._device_slots(self._chunk_offsets([dst for dst, _ in moves])), data)
        for dst, data in loads:
            self.write(dst, data)

    def _chunk_offsets(self, positions: list[int]) -> np.ndarray:
        """Pool offsets of every token of the chunks at ``positions``, chunk after chunk."""
        return (np.asarray(positions, dtype=np.int64)[:, None] * self.chunk + np.arange(self.chunk)).ravel()

    def keys_at(self, positions: list[int]) -> torch.Tensor:
        """[len(positions), layers, chunk, kv_heads, head]: the post-RoPE keys of chunks, one gather per layer."""
        slots = self._device_slots(self._chunk_offsets(positions))
        keys = torch.stack([self._keys(t) for t in self._gather(slots)], dim=1)  # [tokens, layers, H, D]
        return keys.view(len(positions), self.chunk, *keys.shape[1:]).transpose(1, 2)

    def summarize(self, position: int) -> torch.Tensor:
        """[layers, kv_heads, head] fp32: mean of the chunk's post-RoPE keys per KV head (on a GPU, one
        launch reading only the keys; fp8 caches and the CPU take the per-layer torch path)."""
        if self.mover is not None and self.mover.dtype.itemsize > 1:
            from vllm_luce.kernels.chunk_score import key_means  # imports Triton: GPU only

            return key_means(self.mover, self._cache_slots(position), self.head)
        return torch.stack([self._keys(t).float().mean(0) for t in self._tokens(position)])

    def key_bounds(self, position: int, page_tokens: int) -> torch.Tensor:
        """[layers, pages, kv_heads, 2, head] in the cache dtype: per page of ``page_tokens`` of the chunk, the
        element-wise minimum and maximum of its post-RoPE keys per KV head (exact: they are stored values)."""
        out = []
        for tokens in self._tokens(position):
            keys = self._keys(tokens).unflatten(0, (-1, page_tokens))  # [pages, page, H, D]
            out.append(torch.stack([keys.amin(1), keys.amax(1)], dim=2))
        return torch.stack(out)

    def outward_key_bounds(self, position: int, page_tokens: int) -> torch.Tensor:
        """[layers, pages, kv_heads, 2, head] fp8 e5m2: ``key_bounds`` rounded outward (``chunk_bounds.naive.outward_fp8``),
        the bounds policy's summary. On a GPU one launch reads only the keys and writes the fp8 bounds
        (``kernels.chunk_bounds``, bit-identical); fp8 caches and the CPU take the per-layer torch path."""
        if self.mover is not None and self.mover.dtype.itemsize > 1:
            from vllm_luce.kernels.chunk_bounds import key_bounds  # imports Triton: GPU only

            return key_bounds(self.mover, self._cache_slots(position), self.head, page_tokens)
        from vllm_luce.kernels.chunk_bounds.naive import outward_fp8

        return outward_fp8(self.key_bounds(position, page_tokens))

    def salient_keys(self, position: int, scored: ScoredDims = ScoredDims()) -> torch.Tensor:
        """[layers, kv_heads, 2, row_bytes] uint8: per KV head the chunk's two salient keys, their ``scored`` dims
        packed in int4, the salient policy's summary (``kernels/chunk_salient/naive.py``). On a GPU
        one launch reads only the keys (``kernels.chunk_salient``, the same bytes); fp8 caches and the CPU take the
        torch path (``salient_from_keys``)."""
        if self.mover is not None and self.mover.dtype.itemsize > 1:
            from vllm_luce.kernels.chunk_salient import salient_keys  # imports Triton: GPU only

            return salient_keys(self.mover, self._cache_slots(position), self.head, scored)
        from vllm_luce.kernels.chunk_salient.naive import salient_from_keys

        return salient_from_keys(torch.stack([self._keys(t) for t in self._tokens(position)]), scored)

    def _keys(self, tokens: torch.Tensor) -> torch.Tensor:
        """Keys [T, kv_heads, head] of a token-form gather."""
        return tokens[:, :, 0] if self.elements is not None else tokens[..., :self.head]
