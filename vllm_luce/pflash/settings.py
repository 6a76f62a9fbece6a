"""``luce.pflash`` settings -> the pure cores' configs (no vLLM import)."""

from __future__ import annotations

from typing import Any

from vllm_luce.pflash.scorer import ScoringConfig
from vllm_luce.pflash.scoring_queue import QueueConfig
from vllm_luce.pflash.selection import SelectionConfig


def selection_config(feature: Any) -> SelectionConfig:
    return SelectionConfig(
        chunk_tokens=feature.chunk_tokens, keep_ratio=float(feature.keep_ratio),
        keep_curve=tuple((int(t), float(r)) for t, r in feature.keep_curve),
        head_chunks=feature.head_chunks, tail_chunks=feature.tail_chunks, anchors=feature.anchors)


def scoring_config(feature: Any) -> ScoringConfig:
    return ScoringConfig(
        lookahead_tokens=feature.lookahead_tokens, pool_kernel=feature.pool_kernel, pre_rope=feature.pre_rope,
        early_exit_layers=feature.early_exit_layers, attention=feature.attention,
        sparse_alpha=float(feature.sparse_alpha))


def queue_config(feature: Any) -> QueueConfig:
    return QueueConfig(max_prompts=feature.max_queued_prompts, timeout_s=float(feature.queue_timeout_s))
