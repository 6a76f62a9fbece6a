from vllm_luce.kernels.pooled_attention.naive import pooled_attention_naive, pooled_attention_varlen_naive
from vllm_luce.kernels.pooled_attention.pooled_attention import pooled_attention, pooled_attention_varlen

__all__ = ["pooled_attention", "pooled_attention_naive", "pooled_attention_varlen", "pooled_attention_varlen_naive"]
