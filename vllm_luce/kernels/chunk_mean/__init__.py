"""chunk_mean: per-chunk mean of keys over variable-length sequences (Triton kernel + reference)."""

from vllm_luce.kernels.chunk_mean.chunk_mean import chunk_mean
from vllm_luce.kernels.chunk_mean.naive import chunk_mean_naive

__all__ = ["chunk_mean", "chunk_mean_naive"]
