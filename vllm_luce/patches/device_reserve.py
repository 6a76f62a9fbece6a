"""What the initialize_kv_cache patches and the extend_kv_cache patch share on vLLM 0.34's extensible KV cache (see
LEDGER, ``Worker.extend_kv_cache``): the device memory KVFlash and PFlash take once vLLM has sized the KV cache, held
as one tensor from the cache's creation until that sizing is done. Not a patch of its own.

vLLM sizes that cache from the memory free after warm-up and CUDA graph capture, counting everything then allocated
as the engine's, and caps torch's allocator to what stays free; the held tensor is counted so, and freed after the
sizing it leaves room under the cap for what the features allocate while serving.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_luce.log import logger, tag


def features_device_bytes(runner: Any) -> int:
    """What the features bound to ``runner`` take on the device after the KV cache is sized: KVFlash's runtime
    (``kvflash/device_budget.py``, for a cache of at most the capacity vLLM reserved) and PFlash's scoring pass of
    the longest prompt (measured)."""
    total = 0
    kvflash, pflash = getattr(runner, "luce_kvflash", None), getattr(runner, "luce_pflash", None)
    if kvflash is not None:
        from vllm_luce.kvflash.worker import local_query_heads

        total += kvflash.device_bytes_after_sizing(runner.kv_cache_config.num_blocks,
                                                   local_query_heads(runner.vllm_config))
    if pflash is not None:
        total += pflash.device_bytes_after_sizing(runner.vllm_config.model_config.max_model_len)
    return total


def hold(runner: Any) -> int:
    """Hold the features' device bytes on ``runner``'s device until ``release``; returns them."""
    wanted = features_device_bytes(runner)
    if wanted:
        runner.luce_device_reserve = torch.empty(wanted, dtype=torch.uint8, device=runner.device)
        logger.info("%s: %.2f GiB of device memory held for KVFlash and PFlash while vLLM sizes the KV cache", tag(),
                    wanted / 2**30)
    return wanted


def release(runner: Any) -> int:
    """Free what ``hold`` held on ``runner`` (after the KV cache is sized); returns the bytes freed."""
    held = getattr(runner, "luce_device_reserve", None)
    if held is None:
        return 0
    runner.luce_device_reserve = None
    freed = held.numel()
    del held
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # back to the device, under the allocator's cap vLLM set with the memory left free
    logger.info("%s: %.2f GiB held for KVFlash and PFlash freed for them: the KV cache is sized", tag(), freed / 2**30)
    return freed
