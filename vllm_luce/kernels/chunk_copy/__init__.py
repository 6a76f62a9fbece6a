"""chunk_copy: gather and scatter token slots of many layers' paged KV caches in one launch (Triton + reference)."""

from vllm_luce.kernels.chunk_copy.chunk_copy import LayerCaches, gather_tokens, scatter_tokens
from vllm_luce.kernels.chunk_copy.naive import gather_tokens_naive, scatter_tokens_naive

__all__ = ["LayerCaches", "gather_tokens", "gather_tokens_naive", "scatter_tokens", "scatter_tokens_naive"]
