"""Helpers shared by the Triton kernels of vllm_luce.kernels."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# The values Triton itself accepts as "on" for TRITON_INTERPRET (its knobs parse it case-insensitively).
_TRUE_VALUES = frozenset({"1", "true", "on", "yes", "y"})


def is_interpreter() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET is set to a true value).

    Triton reads the variable when it is imported, so it must be set before `import triton`.
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE_VALUES


def autotune(configs: list[triton.Config], key: list[str], **kwargs):
    """`triton.autotune` that keeps only the first config under the interpreter.

    Benchmarking several configs needs a GPU driver and fails under the CPU interpreter; with a
    single config the autotuner launches it directly. So the first config of every kernel should be
    a sound default.
    """
    if is_interpreter():
        configs = configs[:1]
    return triton.autotune(configs=configs, key=key, **kwargs)


# The one autotune list of the chunk kernels (chunk_mean, chunk_score, chunk_bounds, chunk_salient): the tile over
# chunks (or tokens) and the warps, as (block, warps). The first is the one the CPU interpreter runs and a sound default
# on GPUs; the autotuner picks among the rest by the kernel's key.
CHUNK_TILES = ((32, 4), (64, 4), (16, 2), (64, 8), (128, 8))


def chunk_configs(block: str, without: tuple[tuple[int, int], ...] = ()) -> list[triton.Config]:
    """``CHUNK_TILES`` as Triton configs over the kernel's block parameter ``block``, less the (block, warps) pairs in
    ``without``."""
    return [triton.Config({block: size}, num_warps=warps)
            for size, warps in CHUNK_TILES if (size, warps) not in without]


# What the chunk summary and scoring kernels accept: floating caches and queries, head sizes up to 512.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_HEAD_DIM = 512


def check_device(name: str, *tensors: torch.Tensor) -> None:
    """Kernel tensors: all on one CUDA device, or on the CPU under the interpreter."""
    device = tensors[0].device
    if not tensors[0].is_cuda and not is_interpreter():
        raise ValueError(f"{name}: tensors must be on a CUDA device (got {device}); "
                         "CPU tensors run only under TRITON_INTERPRET=1")
    if any(t.device != device for t in tensors):
        raise ValueError(f"{name}: all tensors must be on one device, got {[str(t.device) for t in tensors]}")


def check_key_read(name: str, caches, slots: torch.Tensor, head_dim: int) -> None:
    """A summary kernel's inputs: float caches (fp8 caches take the torch path), non-empty 1-D integer slots, a head
    size the kernel and the cache rows hold."""
    if caches.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: caches must be float32, float16 or bfloat16 (fp8 caches take the torch "
                        f"path), got {caches.dtype}")
    if slots.dim() != 1 or slots.dtype not in (torch.int32, torch.int64) or len(slots) == 0:
        raise ValueError(f"{name}: slots must be a non-empty 1-D int32/int64 tensor, got "
                         f"{list(slots.shape)} {slots.dtype}")
    if not 0 < head_dim <= min(MAX_HEAD_DIM, caches.width):
        raise ValueError(f"{name}: head size must be 1 to {min(MAX_HEAD_DIM, caches.width)}, got {head_dim}")


def scores_out(name: str, out: torch.Tensor | None, num_chunks: int, layers: int, device: torch.device) -> torch.Tensor:
    """The [chunks, layers] float32 output of a chunk-scoring kernel: ``out`` checked, or a new tensor."""
    if out is None:
        return torch.empty(num_chunks, layers, dtype=torch.float32, device=device)
    if tuple(out.shape) != (num_chunks, layers) or out.dtype != torch.float32 or out.device != device:
        raise ValueError(f"{name}: out must be [{num_chunks}, {layers}] float32 on {device}, "
                         f"got {list(out.shape)} {out.dtype} on {out.device}")
    return out


LOG2E = 1.4426950408889634  # kernels keep logits in log2 units and use exp2


def upcast_dots(dtype: torch.dtype) -> bool:
    """The CPU interpreter stores bfloat16 as uint16 and tl.dot multiplies those as integers: there,
    and only there, bf16 dot operands are upcast to fp32 first (GPUs run the bf16 tensor-core dot)."""
    return dtype == torch.bfloat16 and is_interpreter()


@triton.jit
def dot(a, b, IEEE: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot with fp32 operands kept exact (IEEE, not tf32) and the interpreter's bf16 upcast."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)
