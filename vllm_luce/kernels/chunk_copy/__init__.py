"""chunk_copy: gather and scatter token rows of many layers' KV caches in one launch (Triton + reference)."""

from vllm_luce.kernels.chunk_copy.chunk_copy import LayerRows, gather_rows, scatter_rows
from vllm_luce.kernels.chunk_copy.naive import gather_rows_naive, scatter_rows_naive

__all__ = ["LayerRows", "gather_rows", "gather_rows_naive", "scatter_rows", "scatter_rows_naive"]
