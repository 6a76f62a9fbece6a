"""Triton kernels: move a KVFlash chunk's token rows between every pooled layer's KV cache and one
contiguous tensor, in one launch.

Paging a 64-token chunk of a Qwen3-8B-shaped model touches 36 layers x (K, V). Indexing each layer
with torch costs a launch per layer (two with the slot arithmetic), so a 9.4 MB page-out was
launch-bound: 0.44 ms on an H200, about 21 GB/s. Here one program copies one (token, K/V, layer)
row, and the layers are reached through their element offsets from the first cache's base pointer
(every cache has the same shape, strides and dtype, so one set of strides addresses all of them).

Rows must be contiguous (``cache[k, r]`` is one dense run of elements), which holds for vLLM's
FlashAttention/Triton layout viewed as ``[2, blocks * block_size, kv_heads, head_dim]``.
Duplicate slots in a scatter leave one of the writes, unspecified which (as torch's index_put).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import is_interpreter

_MAX_BLOCK = 2048  # elements per tile: a 1,024-element row (8 heads x 128) is one tile


@triton.jit
def _copy_rows_kernel(cache_base, layer_offsets, slots, flat,
                      stride_kv, stride_row, num_tokens, row_elems,
                      TO_FLAT: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    kv = tl.program_id(1)
    layer = tl.program_id(2)
    slot = tl.load(slots + token).to(tl.int64)
    cache_row = cache_base + tl.load(layer_offsets + layer) + kv.to(tl.int64) * stride_kv + slot * stride_row
    flat_row = flat + ((layer.to(tl.int64) * 2 + kv) * num_tokens + token) * row_elems
    for start in range(0, row_elems, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < row_elems
        if TO_FLAT:
            tl.store(flat_row + cols, tl.load(cache_row + cols, mask=mask), mask=mask)
        else:
            tl.store(cache_row + cols, tl.load(flat_row + cols, mask=mask), mask=mask)


class LayerRows:
    """Every layer's ``[2, rows, *row]`` cache view, checked once; each gather or scatter is one launch.

    All caches must share shape, strides, dtype and device, and a row must be contiguous."""

    def __init__(self, caches: list[torch.Tensor]):
        if not caches:
            raise ValueError("chunk_copy: caches must name at least one layer")
        first = caches[0]
        if first.dim() < 3 or first.shape[0] != 2:
            raise ValueError(f"chunk_copy: each cache must be [2, rows, ...], got {list(first.shape)}")
        for i, cache in enumerate(caches):
            if cache.shape != first.shape or cache.stride() != first.stride() or cache.dtype != first.dtype \
                    or cache.device != first.device:
                raise ValueError(
                    f"chunk_copy: cache {i} is {list(cache.shape)} {cache.dtype} strides {cache.stride()} on "
                    f"{cache.device}; every cache must match cache 0 ({list(first.shape)} {first.dtype} "
                    f"strides {first.stride()} on {first.device})")
        if not first[0, 0].is_contiguous():
            raise ValueError(f"chunk_copy: a cache row ({list(first.shape[2:])}) must be contiguous, "
                             f"strides {first.stride()}")
        if first.is_cuda == is_interpreter():  # the interpreter reaches layers by host address
            raise ValueError("chunk_copy: caches must be on a CUDA device, or on the CPU under TRITON_INTERPRET=1 "
                             f"(got {first.device})")
        self.caches, self.dtype, self.device = caches, first.dtype, first.device
        self.row_shape = tuple(first.shape[2:])
        # fp8 caches move as bytes (bit-exact either way; the kernel needs a dtype Triton loads everywhere)
        self.base = first.view(torch.uint8) if first.element_size() == 1 else first
        size = first.element_size()
        deltas = [cache.data_ptr() - first.data_ptr() for cache in caches]
        if any(d % size for d in deltas):
            raise ValueError(f"chunk_copy: cache base addresses must be {size}-byte aligned relative to each other")
        self.offsets = torch.tensor([d // size for d in deltas], dtype=torch.int64, device=first.device)
        self.row_elems = first[0, 0].numel()
        self._block = min(triton.next_power_of_2(max(self.row_elems, 1)), _MAX_BLOCK)

    def shape(self, num_slots: int) -> tuple[int, ...]:
        return (len(self.caches), 2, num_slots, *self.row_shape)

    def gather(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``torch.stack([c[:, slots] for c in caches])``: ``[layers, 2, len(slots), *row]``.
        out: optional contiguous tensor of that shape and the caches' dtype to write into."""
        shape = self.shape(len(slots))
        if out is None:
            out = torch.empty(shape, dtype=self.dtype, device=self.device)
        elif tuple(out.shape) != shape or out.dtype != self.dtype or out.device != self.device \
                or not out.is_contiguous():
            raise ValueError(f"gather_rows: out must be a contiguous {list(shape)} {self.dtype} tensor on "
                             f"{self.device}, got {list(out.shape)} {out.dtype} on {out.device}")
        self._launch(slots, out, True)
        return out

    def scatter(self, slots: torch.Tensor, src: torch.Tensor) -> None:
        """``c[:, slots] = src[l]`` for every layer ``l``; ``src`` as ``gather`` returns it."""
        shape = self.shape(len(slots))
        if tuple(src.shape) != shape or src.dtype != self.dtype or src.device != self.device:
            raise ValueError(f"scatter_rows: src must be a {list(shape)} {self.dtype} tensor on {self.device}, "
                             f"got {list(src.shape)} {src.dtype} on {src.device}")
        self._launch(slots, src.contiguous(), False)

    def _launch(self, slots: torch.Tensor, flat: torch.Tensor, to_flat: bool) -> None:
        if slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"chunk_copy: slots must be a 1-D int32/int64 tensor, got {list(slots.shape)} {slots.dtype}")
        if len(slots) == 0 or self.row_elems == 0:
            return
        base = self.base
        flat = flat.view(torch.uint8) if base.dtype == torch.uint8 else flat
        _copy_rows_kernel[(len(slots), 2, len(self.caches))](
            base, self.offsets, slots.to(self.device), flat, base.stride(0), base.stride(1), len(slots),
            self.row_elems, TO_FLAT=to_flat, BLOCK=self._block)


def gather_rows(caches: list[torch.Tensor], slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.stack([c[:, slots] for c in caches])`` in one launch (see ``LayerRows``)."""
    return LayerRows(caches).gather(slots, out)


def scatter_rows(caches: list[torch.Tensor], slots: torch.Tensor, src: torch.Tensor) -> None:
    """``c[:, slots] = src[l]`` for every layer ``l`` in one launch (see ``LayerRows``)."""
    LayerRows(caches).scatter(slots, src)
