"""KVFlash's runtime at startup (``vllm_luce/kvflash/runtime.py``): the warm-up that compiles the paging and scoring
kernels says before it starts what it compiles on, and after it the time taken (the pinning lines:
``test_pinning.py``)."""

from types import SimpleNamespace

import torch

from vllm_luce.kvflash.kv_store import PACKED_LAYOUT
from vllm_luce.kvflash.pager import PagerConfig
from vllm_luce.kvflash.runtime import KVFlashRuntime


def test_the_kernel_warm_up_is_announced_with_its_size_then_timed(luce_log, monkeypatch):
    rt = KVFlashRuntime(PagerConfig(pool_tokens=384), "lru", [], PACKED_LAYOUT, 128, 16, 4)
    rt.caches = [SimpleNamespace(device=SimpleNamespace(type="cuda"))] * 3  # a GPU's caches, as warm_up sees them
    chunk, moved = torch.zeros(2, 64, 1, 128), []
    store = SimpleNamespace(read=lambda i: chunk, read_host=lambda i: chunk, synchronize=lambda: None,
                            write=lambda i, host: moved.append(i))
    monkeypatch.setattr(rt, "_new_store", lambda: store)
    monkeypatch.setattr(rt, "pin_host_memory", lambda shape, dtype: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    rt.warm_up()
    lines = [r.getMessage() for r in luce_log.records]
    assert moved == [0] and len(lines) == 2, lines
    assert lines[0].endswith("KVFlash: compiling the paging and scoring kernels "
                             "(a chunk of 64 tokens out and back on 3 layers)")
    assert "KVFlash: kernels compiled in " in lines[1]
