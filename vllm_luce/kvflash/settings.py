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


# "auto": pinned at startup, about 13 s of it on an H200 (1.25 GB/s); 16 GiB holds the paged-out KV of a 128K-token
# prompt of the 8B shape (18.7 GB) but 2.7 GB (docs/kvflash.md).
AUTO_PINNED_BYTES = 16 << 30


def resolve_pinned_bytes(pinned_bytes, host_budget: int) -> int:
    """Host memory this worker pins at startup for page-outs: the setting or 'auto', at most its host budget."""
    return min(AUTO_PINNED_BYTES if pinned_bytes == "auto" else int(pinned_bytes), host_budget)


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
