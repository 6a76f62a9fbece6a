"""Laguna (poolside): full and sliding-window attention with a softplus output gate, MoE or dense MLP."""

from vllm.model_executor.models.laguna import LagunaForCausalLM

from vllm_luce.model_executor.executor import LuceExecutor


class LuceLagunaForCausalLM(LuceExecutor, LagunaForCausalLM):
    upstream_architecture = "LagunaForCausalLM"
