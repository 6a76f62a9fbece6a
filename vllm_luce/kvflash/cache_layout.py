"""Where vLLM's attention backend puts each token's K and V inside a KV cache block (KVFlash pages tokens by it).

GPU backends (FlashAttention, Triton, FlashInfer) pack a block's tokens contiguously (``PACKED_LAYOUT``). vLLM's CPU
kernel interleaves them in an ISA-dependent pattern, found here by writing probe values through the kernel itself.
"""

from __future__ import annotations

import torch

from vllm_luce.kvflash.kv_store import CPU_LAYOUT, PACKED_LAYOUT, TokenLayout


def layout_for_backend(backend_name: str) -> TokenLayout:
    if backend_name == "CPU_ATTN":
        return CPU_LAYOUT
    if backend_name in ("FLASH_ATTN", "TRITON_ATTN", "FLASHINFER"):
        return PACKED_LAYOUT
    raise NotImplementedError(f"KVFlash: attention backend {backend_name} is not supported "
                              "(supported: CPU_ATTN, FLASH_ATTN, TRITON_ATTN, FLASHINFER)")


def cpu_ops():
    """vLLM's module of CPU ops: vllm._cpu_ops from vLLM 0.34, vllm._custom_ops before (the hook table checks
    cpu_attn_reshape_and_cache in both per series)."""
    import importlib
    import importlib.util

    return importlib.import_module("vllm._cpu_ops" if importlib.util.find_spec("vllm._cpu_ops") else "vllm._custom_ops")


def probe_cpu_elements(isa: str, block: int, head: int, dtype: torch.dtype) -> torch.Tensor:
    """[block, 2 * head]: where vLLM's CPU kernel for ``isa`` puts token t's K (then V) elements inside
    one (block, KV head) region, found by writing probe values through the kernel itself. Each probe
    writes a digit below 128 (exact in bf16): K-or-V, t % 128, t // 128, d % 128, d // 128."""
    ops = cpu_ops()

    t = torch.arange(block)[:, None, None].expand(block, 1, head)
    d = torch.arange(head)[None, None, :].expand(block, 1, head)

    def place(k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache = torch.full((1, 1, block, 2 * head), -1.0, dtype=dtype)
        key_cache, value_cache = cache.view(1, 1, 2 * block, head).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(k.to(dtype).contiguous(), v.to(dtype).contiguous(), key_cache, value_cache,
                                       torch.arange(block, dtype=torch.int64), isa)
        return cache.flatten().long()

    is_v = place(torch.zeros_like(t), torch.ones_like(t))
    token = place(t % 128, t % 128) + 128 * place(t // 128, t // 128)
    dim = place(d % 128, d % 128) + 128 * place(d // 128, d // 128)
    if bool((is_v < 0).any()) or bool((token < 0).any()):
        raise RuntimeError(f"KVFlash: vLLM's CPU kernel ({isa}) left KV cache elements unwritten; cannot map its layout")
    elements = torch.full((block, 2 * head), -1, dtype=torch.int64)
    elements[token, is_v * head + dim] = torch.arange(token.numel())
    if bool((elements < 0).any()):
        raise RuntimeError(f"KVFlash: vLLM's CPU kernel ({isa}) KV layout is not a permutation of tokens x head dims")
    return elements


def cache_layout(backend_name: str, layer, spec, block: int) -> TokenLayout:
    """The group's token layout; on the CPU backend with the element map of the layer's kernel ISA."""
    layout = layout_for_backend(backend_name)
    if layout.name != "cpu":
        return layout
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = getattr(layer, "isa", None) or _get_attn_isa(spec.dtype, block, spec.head_size)
    return layout.with_elements(probe_cpu_elements(isa, block, spec.head_size, spec.dtype))
