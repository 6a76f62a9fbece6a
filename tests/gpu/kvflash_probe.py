"""In-process KVFlash probes for the GPU tier's engine (VLLM_ENABLE_V1_MULTIPROCESSING=0, TP 1): the most
blocks the scheduler's KVFlash manager held for a request, and whether every chunk paged back in reads
back from vLLM's cache exactly as the bytes paged out."""

from __future__ import annotations

import torch


def _core(llm):
    return llm.llm_engine.engine_core.engine_core


def manager(llm):
    from vllm_luce.kvflash.spec import KVFlashManager

    managers = _core(llm).scheduler.kv_cache_manager.coordinator.single_type_managers
    return next(m for m in managers if isinstance(m, KVFlashManager))


def install(llm) -> dict:
    """Start recording; the returned dict fills as the engine runs."""
    from vllm_luce.kvflash.kv_store import PagedPoolStore

    found = {"most_blocks": 0, "pool_blocks": manager(llm).kv_cache_spec.pool_blocks, "loads_checked": 0,
             "loads_exact": 0}
    kv = manager(llm)
    allocate = kv.allocate_new_blocks

    def recording(request_id, *args, **kwargs):
        blocks = allocate(request_id, *args, **kwargs)
        found["most_blocks"] = max(found["most_blocks"], len(kv.req_to_blocks[request_id]))
        return blocks

    kv.allocate_new_blocks = recording
    rearrange = PagedPoolStore.rearrange

    def checking(store, moves, loads):
        rearrange(store, moves, loads)
        for dst, data in loads:
            back = store.read(dst)
            found["loads_checked"] += 1
            found["loads_exact"] += int(torch.equal(back.view(torch.uint8), data.to(back.device).view(torch.uint8)))

    PagedPoolStore.rearrange = checking
    return found
