"""Patch: bf16 linear layers on CPUs without bf16 dot products compute in float32 (see LEDGER).

On an x86 CPU without AVX512-BF16 (AVX2 only, as this project's CI hosts), oneDNN cannot build vLLM's bf16
matmul ("could not create a primitive descriptor") and vLLM falls back to ``torch.nn.functional.linear`` in
bf16, which PyTorch emulates. Measured on a 2-core AMD EPYC (AVX2), trained Qwen3.6 shapes: 16 x 256 x 4096
in 2.29 ms against 0.45 ms through a float32 copy of the weight, and 1600 x 256 x 1024 in 66.5 ms against
6.5 ms. Here such a layer keeps a float32 copy of its weight, made once at load, and computes in float32:
the bf16 inputs convert exactly, the sum accumulates in float32 (as PyTorch's bf16 kernel does too), and
the result rounds to bf16. CPUs with bf16 dot products, other dtypes and larger weights keep vLLM's path.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.patches import ledger_signature, wrap_function

TARGET = "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm"
MAX_FP32_WEIGHT_BYTES = 64 << 20  # a larger layer keeps vLLM's path: its copy would cost more than it saves


def native_bf16_cpu() -> bool:
    """True where vLLM's bf16 kernels run natively: bf16 dot products (vLLM's own test for its C++ conv:
    AVX512-BF16 or Arm bf16) or AMX."""
    from vllm_luce.patches.cpu_gdn_spec import cpp_conv_supported

    return bool(cpp_conv_supported() or torch.cpu._is_amx_tile_supported())


def upcast(weight: torch.Tensor) -> bool:
    """Whether this layer's weight takes the float32 path."""
    return (weight.dtype == torch.bfloat16 and weight.dim() == 2 and not weight.is_meta
            and weight.numel() * 4 <= MAX_FP32_WEIGHT_BYTES)


def float32_linear(weight: torch.Tensor, bias: torch.Tensor | None):
    """``layer.cpu_linear`` over a float32 copy of ``weight`` (and ``bias``); the output has the input's dtype."""
    weight32 = weight.detach().float()
    bias32 = None if bias is None else bias.detach().float()

    def linear(x: torch.Tensor, _weight, _bias) -> torch.Tensor:
        return torch.nn.functional.linear(x.float(), weight32, bias32).to(x.dtype)

    return linear


def _make_wrapper(original):
    @functools.wraps(original)
    def dispatch_cpu_unquantized_gemm(layer, remove_weight):
        if not upcast(layer.weight):
            return original(layer, remove_weight)
        from vllm_luce import hooks

        hooks.bind("vllm.model_executor.layers.linear:LinearBase.cpu_linear", layer,
                   float32_linear(layer.weight, getattr(layer, "bias", None)))
        if remove_weight:  # as vLLM's own prepacked paths do: the copy is what the layer computes with
            hooks.bind("vllm.model_executor.layers.linear:LinearBase.weight", layer,
                       torch.nn.Parameter(torch.empty(0, dtype=layer.weight.dtype), requires_grad=False))
        return None

    return dispatch_cpu_unquantized_gemm


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or native_bf16_cpu():
        return False
    from vllm.model_executor.layers import utils

    return wrap_function(utils, "dispatch_cpu_unquantized_gemm", ledger_signature(TARGET), _make_wrapper)
