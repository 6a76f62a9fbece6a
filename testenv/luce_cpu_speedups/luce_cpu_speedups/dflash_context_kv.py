"""The DFlash drafter's context K/V projection computes in float32 on CPUs without bf16 dot products (a
test-environment speed-up).

vLLM's Qwen3 DFlash drafter projects the target's context features to every layer's K/V in one GEMM over a
fused bf16 weight (``F.linear`` in ``_project_context_kv``), outside its linear layers, so ``bf16_linear``
does not reach it and PyTorch emulates the bf16 GEMM: in the load test's all-features server that GEMM was
most of what DFlash added to the time of a server without it.

Here, once the drafter has built its context buffers, each layer's context projection becomes a float32 copy
of its K/V rows, called through the per-layer path vLLM keeps for quantized layers (``q_size`` 0: the
projection returns K/V only). As in ``bf16_linear``, the bf16 inputs convert exactly, the sum
accumulates in float32 and the result rounds to bf16. Drafters whose class has its own projection (Laguna's
stacked ``bmm``), other dtypes, large weights and CPUs with bf16 dot products keep vLLM's path.
"""

from __future__ import annotations

import functools

import torch

from luce_cpu_speedups import applied, isa, signature
from luce_cpu_speedups.bf16_linear import float32_linear, upcast
from vllm_luce.patches import wrap_method

TARGET = "vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._build_context_kv_buffers"


class Float32ContextKV:
    """One layer's context projection as vLLM's per-layer path calls it: ``proj(x) -> (kv, None)``, through
    ``bf16_linear``'s float32 copy of the layer's K/V rows; the output has the input's dtype."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self._linear = float32_linear(weight, bias)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self._linear(x, None, None), None


def float32_projections(fused_weight: torch.Tensor, fused_bias: torch.Tensor | None,
                        layers: int) -> list[Float32ContextKV] | None:
    """Per-layer float32 projections of a fused ``[layers * 2 * kv_size, hidden]`` bf16 K/V weight, or None
    where that weight keeps vLLM's path."""
    rows, remainder = divmod(fused_weight.shape[0], layers)
    if remainder:
        return None
    weights = fused_weight.split(rows)
    if not all(upcast(w) for w in weights):
        return None
    biases = [None] * layers if fused_bias is None else fused_bias.split(rows)
    return [Float32ContextKV(w, b) for w, b in zip(weights, biases)]


def _make_wrapper(original, base_projection):
    @functools.wraps(original)
    def _build_context_kv_buffers(self, layers_attn, has_bias):
        original(self, layers_attn, has_bias)
        fused = getattr(self, "_fused_kv_weight", None)
        if fused is None or type(self)._project_context_kv is not base_projection:
            return  # quantized layers, or a drafter class with its own projection
        projections = float32_projections(fused, self._fused_kv_bias, len(layers_attn))
        if projections is None:
            return
        self._context_qkv_projs = projections
        self._context_q_sizes = [0] * len(projections)
        self._fused_kv_weight = self._fused_kv_bias = None  # the float32 copies are what it computes with

    return _build_context_kv_buffers


def apply() -> bool:
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or isa.native_bf16():
        return False
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3Model

    base_projection = DFlashQwen3Model._project_context_kv
    done = wrap_method(DFlashQwen3Model, "_build_context_kv_buffers", signature(TARGET),
                       lambda original: _make_wrapper(original, base_projection))
    if done:
        applied(TARGET)
    return done
