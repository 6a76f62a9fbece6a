from vllm_luce.kernels.pooled_attention.naive import pooled_attention_naive
from vllm_luce.kernels.pooled_attention.pooled_attention import pooled_attention

__all__ = ["pooled_attention", "pooled_attention_naive"]
