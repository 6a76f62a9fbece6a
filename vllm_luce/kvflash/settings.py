"""KVFlash settings that depend on nothing but the LuceConfig (pure)."""

from __future__ import annotations

from vllm_luce.kvflash.pager import PagerConfig

# "auto": 4096 tokens, Lucebox's default budget (72 MiB of resident KV for Qwen3.6-27B at any context).
AUTO_POOL_TOKENS = 4096


def resolve_pool_tokens(pool_tokens, chunk_tokens: int) -> int:
    if pool_tokens == "auto":
        return max(AUTO_POOL_TOKENS // chunk_tokens, 1) * chunk_tokens
    return pool_tokens


def pager_config_from(kvflash) -> PagerConfig:
    """Validates the pool against the chunk and the floor (a KVFlashConfigError names the key)."""
    return PagerConfig(pool_tokens=resolve_pool_tokens(kvflash.pool_tokens, kvflash.chunk_tokens),
                       chunk_tokens=kvflash.chunk_tokens, sink_chunks=kvflash.sink_chunks,
                       recent_chunks=kvflash.recent_chunks)
