"""Qwen3.5 / Qwen3.6 (the `qwen3_5` model types): Gated DeltaNet + gated full attention, dense and MoE.

Qwen3.6 checkpoints declare the Qwen3.5 architectures, so these four classes serve both.
"""

from vllm.model_executor.models.qwen3_5 import (
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)

from vllm_luce.model_executor.executor import LuceExecutor


class LuceQwen3_5ForCausalLM(LuceExecutor, Qwen3_5ForCausalLM):
    upstream_architecture = "Qwen3_5ForCausalLM"


class LuceQwen3_5MoeForCausalLM(LuceExecutor, Qwen3_5MoeForCausalLM):
    upstream_architecture = "Qwen3_5MoeForCausalLM"


class LuceQwen3_5ForConditionalGeneration(LuceExecutor, Qwen3_5ForConditionalGeneration):
    upstream_architecture = "Qwen3_5ForConditionalGeneration"


class LuceQwen3_5MoeForConditionalGeneration(LuceExecutor, Qwen3_5MoeForConditionalGeneration):
    upstream_architecture = "Qwen3_5MoeForConditionalGeneration"
