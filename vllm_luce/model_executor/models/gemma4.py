"""Gemma 4: interleaved sliding-window and full attention, with cross-layer KV sharing."""

from vllm.model_executor.models.gemma4 import Gemma4ForCausalLM
from vllm.model_executor.models.gemma4_mm import Gemma4ForConditionalGeneration

from vllm_luce.model_executor.executor import LuceExecutor


class LuceGemma4ForCausalLM(LuceExecutor, Gemma4ForCausalLM):
    upstream_architecture = "Gemma4ForCausalLM"


class LuceGemma4ForConditionalGeneration(LuceExecutor, Gemma4ForConditionalGeneration):
    upstream_architecture = "Gemma4ForConditionalGeneration"
