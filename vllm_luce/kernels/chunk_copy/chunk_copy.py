"""Triton kernels: move a KVFlash chunk's tokens between every pooled layer's paged KV cache and one
contiguous tensor, in one launch.

vLLM's GPU attention backends (FLASH_ATTN, TRITON_ATTN, FLASHINFER; vLLM 0.26 through 0.33) give each
layer a cache ``[blocks, kv_heads, block_size, 2 * head]``: K then V in the last dimension, stored
token-major (the default NHD stride order, where one token's heads are one dense run) or head-major
(HND); a hybrid model's blocks may be padded to the Mamba page size. A slot ``s`` is token
``s % block_size`` of block ``s // block_size``, as in vLLM's slot mapping, so the kernel reaches it
through the cache's own strides and works for every such layout.

Paging a 64-token chunk of a Qwen3-8B-shaped model touches 36 layers. Indexing each layer with torch
costs a launch per layer (two with the slot arithmetic), so paging that way is launch-bound
(docs/benchmarks.md, "KVFlash paging throughput (GPU)"). Here one program copies one (token, layer, run), where a
run is a token's heads
when they are contiguous and one head otherwise; layers are reached through their element offsets
from the first cache's base pointer (all caches share shape, strides and dtype). Duplicate slots in a
scatter leave one of the writes, unspecified which (as torch's index_put).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from vllm_luce.kernels._triton import is_interpreter

_MAX_BLOCK = 2048  # elements per tile: a token's 8 heads x 256 (K and V of 128) is one tile


@triton.jit
def _copy_tokens_kernel(cache_base, layer_offsets, slots, flat,
                        block_size, stride_block, stride_run, stride_token, num_tokens, num_runs, run_elems,
                        TO_FLAT: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0)
    layer = tl.program_id(1)
    run = tl.program_id(2).to(tl.int64)
    slot = tl.load(slots + token).to(tl.int64)
    cache_run = (cache_base + tl.load(layer_offsets + layer) + (slot // block_size) * stride_block
                 + (slot % block_size) * stride_token + run * stride_run)
    flat_run = flat + ((layer.to(tl.int64) * num_tokens + token) * num_runs + run) * run_elems
    for start in range(0, run_elems, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < run_elems
        if TO_FLAT:
            tl.store(flat_run + cols, tl.load(cache_run + cols, mask=mask), mask=mask)
        else:
            tl.store(cache_run + cols, tl.load(flat_run + cols, mask=mask), mask=mask)


class LayerCaches:
    """Every pooled layer's ``[blocks, kv_heads, block_size, width]`` cache, checked once; each gather or
    scatter of token slots is one launch. All caches must share shape, strides, dtype and device, with
    unit stride in the last dimension."""

    def __init__(self, caches: list[torch.Tensor]):
        if not caches:
            raise ValueError("chunk_copy: caches must name at least one layer")
        first = caches[0]
        if first.dim() != 4:
            raise ValueError(f"chunk_copy: each cache must be [blocks, kv_heads, block_size, width], "
                             f"got {list(first.shape)}")
        for i, cache in enumerate(caches):
            if cache.shape != first.shape or cache.stride() != first.stride() or cache.dtype != first.dtype \
                    or cache.device != first.device:
                raise ValueError(
                    f"chunk_copy: cache {i} is {list(cache.shape)} {cache.dtype} strides {cache.stride()} on "
                    f"{cache.device}; every cache must match cache 0 ({list(first.shape)} {first.dtype} "
                    f"strides {first.stride()} on {first.device})")
        if first.stride(3) != 1:
            raise ValueError(f"chunk_copy: the last dimension must be contiguous, strides {first.stride()}")
        if first.is_cuda == is_interpreter():  # the interpreter reaches layers by host address
            raise ValueError("chunk_copy: caches must be on a CUDA device, or on the CPU under TRITON_INTERPRET=1 "
                             f"(got {first.device})")
        self.caches, self.dtype, self.device = caches, first.dtype, first.device
        _, self.heads, self.block_size, self.width = first.shape
        # fp8 caches move as bytes (bit-exact either way; the kernel needs a dtype Triton loads everywhere)
        self.base = first.view(torch.uint8) if first.element_size() == 1 else first
        size = first.element_size()
        deltas = [cache.data_ptr() - first.data_ptr() for cache in caches]
        if any(d % size for d in deltas):
            raise ValueError(f"chunk_copy: cache base addresses must be {size}-byte aligned relative to each other")
        self.offsets = torch.tensor([d // size for d in deltas], dtype=torch.int64, device=first.device)
        heads_dense = self.heads == 1 or first.stride(1) == self.width  # a token's heads are one run (NHD)
        self.runs = 1 if heads_dense else self.heads
        self.run_elems = self.width * (self.heads if heads_dense else 1)
        self._block = min(triton.next_power_of_2(max(self.run_elems, 1)), _MAX_BLOCK)

    def shape(self, num_slots: int) -> tuple[int, ...]:
        return (len(self.caches), num_slots, self.heads, self.width)

    def gather(self, slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``[layers, len(slots), kv_heads, width]``: each layer's tokens at ``slots``.
        out: optional contiguous tensor of that shape and the caches' dtype to write into."""
        shape = self.shape(len(slots))
        if out is None:
            out = torch.empty(shape, dtype=self.dtype, device=self.device)
        elif tuple(out.shape) != shape or out.dtype != self.dtype or out.device != self.device \
                or not out.is_contiguous():
            raise ValueError(f"gather_tokens: out must be a contiguous {list(shape)} {self.dtype} tensor on "
                             f"{self.device}, got {list(out.shape)} {out.dtype} on {out.device}")
        self._launch(slots, out, True)
        return out

    def scatter(self, slots: torch.Tensor, src: torch.Tensor) -> None:
        """Write ``src`` (as ``gather`` returns it) into each layer's tokens at ``slots``."""
        shape = self.shape(len(slots))
        if tuple(src.shape) != shape or src.dtype != self.dtype or src.device != self.device:
            raise ValueError(f"scatter_tokens: src must be a {list(shape)} {self.dtype} tensor on {self.device}, "
                             f"got {list(src.shape)} {src.dtype} on {src.device}")
        self._launch(slots, src.contiguous(), False)

    def _launch(self, slots: torch.Tensor, flat: torch.Tensor, to_flat: bool) -> None:
        if slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"chunk_copy: slots must be a 1-D int32/int64 tensor, got {list(slots.shape)} {slots.dtype}")
        if len(slots) == 0 or self.run_elems == 0:
            return
        base = self.base
        flat = flat.view(torch.uint8) if base.dtype == torch.uint8 else flat
        _copy_tokens_kernel[(len(slots), len(self.caches), self.runs)](
            base, self.offsets, slots.to(self.device), flat, self.block_size, base.stride(0), base.stride(1),
            base.stride(2), len(slots), self.runs, self.run_elems, TO_FLAT=to_flat, BLOCK=self._block)


def gather_tokens(caches: list[torch.Tensor], slots: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``gather_tokens_naive`` in one launch (see ``LayerCaches``)."""
    return LayerCaches(caches).gather(slots, out)


def scatter_tokens(caches: list[torch.Tensor], slots: torch.Tensor, src: torch.Tensor) -> None:
    """``scatter_tokens_naive`` in one launch (see ``LayerCaches``)."""
    LayerCaches(caches).scatter(slots, src)
