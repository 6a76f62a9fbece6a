"""What vLLM's CPU kernels run natively on this CPU, read the way vLLM reads it, at the time of the call (tests
force every host kind through ``torch.cpu`` and the platform: ``tests/patches/test_cpu_isa.py: force_host``)."""

from __future__ import annotations

import torch


def bf16_dot_products() -> bool:
    """vLLM's own test for its C++ Gated DeltaNet conv: AVX512-BF16, or Arm with bf16."""
    from vllm.model_executor.layers.mamba.ops.cpu import gdn_attention

    return bool(torch.cpu._is_avx512_bf16_supported() or gdn_attention.is_arm_bf16())


def native_bf16() -> bool:
    """True where vLLM's bf16 kernels run natively: bf16 dot products or AMX. Elsewhere (x86 with AVX2 only)
    oneDNN builds no bf16 matmul and PyTorch emulates bf16 arithmetic."""
    return bool(bf16_dot_products() or torch.cpu._is_amx_tile_supported())
