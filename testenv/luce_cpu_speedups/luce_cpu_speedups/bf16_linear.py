"""bf16 linear layers on CPUs without bf16 dot products compute in float32 (a test-environment speed-up).

On an x86 CPU without AVX512-BF16 (AVX2 only, as this project's CI hosts), oneDNN cannot build vLLM's bf16
matmul ("could not create a primitive descriptor") and vLLM falls back to ``torch.nn.functional.linear`` in
bf16, which PyTorch emulates several times slower than a float32 matmul through a float32 copy of the
weight. Here such a layer keeps a float32 copy of its weight, made once at load, and computes in float32:
the bf16 inputs convert exactly, the sum accumulates in float32 (as PyTorch's bf16 kernel does too), and
the result rounds to bf16. CPUs with bf16 dot products, other dtypes and larger weights keep vLLM's path.
"""

from __future__ import annotations

import functools

import torch

from luce_cpu_speedups import applied, isa, signature
from vllm_luce.patches import wrap_function

TARGET = "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm"
MAX_FP32_WEIGHT_BYTES = 64 << 20  # a larger layer keeps vLLM's path: its copy would cost more than it saves


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
        layer.cpu_linear = float32_linear(layer.weight, getattr(layer, "bias", None))  # where vLLM's dispatch sets it
        if remove_weight:  # as vLLM's own prepacked paths do: the copy is what the layer computes with
            layer.weight = torch.nn.Parameter(torch.empty(0, dtype=layer.weight.dtype), requires_grad=False)
        return None

    return dispatch_cpu_unquantized_gemm


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or isa.native_bf16():
        return False
    from vllm.model_executor.layers import utils

    done = wrap_function(utils, "dispatch_cpu_unquantized_gemm", signature(TARGET), _make_wrapper)
    if done:
        applied(TARGET)
    return done
