"""chunk_score: KVFlash's QK policy on the GPU. Chunk key summaries read straight from every layer's
KV cache, and cosine scoring of the summaries against the current queries (Triton + reference)."""

from vllm_luce.kernels.chunk_score.chunk_score import chunk_scores, key_means
from vllm_luce.kernels.chunk_score.naive import chunk_scores_naive, key_means_naive

__all__ = ["chunk_scores", "chunk_scores_naive", "key_means", "key_means_naive"]
