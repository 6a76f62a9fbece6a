"""KVFlash settings that depend on nothing but the LuceConfig (pure)."""

from __future__ import annotations

import os

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


def resolve_pinned_bytes(pinned_bytes, host_budget: int | None, chunk_bytes: int, max_model_len: int,
                         pool_tokens: int, chunk_tokens: int) -> int:
    """Host memory this worker pins at startup for page-outs, at most its host budget. 'auto': what one request
    of the longest context pages out (its tokens beyond the pool, in chunks of ``chunk_bytes`` on this worker):
    a prompt of any length pages out without pinning while it is served (host_pool.py), and more concurrent long
    requests than one page their excess to pageable memory."""
    if pinned_bytes == "auto":
        chunks = -(-max(0, max_model_len - pool_tokens) // chunk_tokens)
        pinned_bytes = chunks * chunk_bytes
    return min(int(pinned_bytes), host_budget if host_budget is not None else int(pinned_bytes))


def resolve_host_bytes(host_bytes, local_ranks: int = 1, meminfo: str = "/proc/meminfo") -> int:
    """Host memory this worker may hold in paged-out KV: the setting, or for 'auto' half of the memory
    available now (``MemAvailable``), split between the ranks of this host."""
    if host_bytes != "auto":
        return int(host_bytes)
    try:
        with open(meminfo) as f:
            available_kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        available_kib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 1024
    return available_kib * 1024 // 2 // max(1, local_ranks)
