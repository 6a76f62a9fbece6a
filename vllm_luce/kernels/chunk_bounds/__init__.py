"""chunk_bounds: KVFlash's key-bounds policy on the GPU. Per-page key bounds (fp8 e5m2, rounded outward) read
straight from every layer's KV cache, and the bound scores of chunks against the current queries (Triton +
reference)."""

from vllm_luce.kernels.chunk_bounds.chunk_bounds import bound_scores, key_bounds
from vllm_luce.kernels.chunk_bounds.naive import bound_scores_naive, key_bounds_naive

__all__ = ["bound_scores", "bound_scores_naive", "key_bounds", "key_bounds_naive"]
