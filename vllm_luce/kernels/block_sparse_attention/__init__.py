"""block_sparse_attention: FlashPrefill-style block-sparse causal prefill attention (Triton + reference).

block_mean_keys -> select_blocks (block scores of each query block against the mean keys, kept
blocks by sink / window / last-rows rules and a relative score threshold) -> sparse_attention_forward.
block_sparse_attention runs all three; see naive.py for the semantics.
"""

from vllm_luce.kernels.block_sparse_attention.block_select import block_mean_keys, block_scores, select_blocks
from vllm_luce.kernels.block_sparse_attention.block_sparse_attention import (
    block_sparse_attention, kept_fraction, sparse_attention_forward)
from vllm_luce.kernels.block_sparse_attention.naive import (
    block_mean_keys_naive, block_scores_naive, block_sparse_attention_naive, keep_mask_naive)

__all__ = [
    "block_mean_keys", "block_scores", "select_blocks", "block_sparse_attention", "kept_fraction",
    "sparse_attention_forward", "block_mean_keys_naive", "block_scores_naive", "block_sparse_attention_naive",
    "keep_mask_naive",
]
