"""tail_score: per-key attention scores of the last L prompt queries (Triton kernel + reference)."""

from vllm_luce.kernels.tail_score.naive import tail_score_naive
from vllm_luce.kernels.tail_score.tail_score import tail_score

__all__ = ["tail_score", "tail_score_naive"]
