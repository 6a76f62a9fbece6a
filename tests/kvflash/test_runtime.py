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


def paged_run(monkeypatch=None, lent_blocks: int = 0, steps: int = 12, log_choices: bool = False):
    """One request prefilled in steps of 96 tokens through ``plan`` on CPU caches: a pool of 6 chunks of 16 tokens
    (blocks of 32), the row the pool's 3 blocks plus ``lent_blocks`` lent for cold chunks. Returns the runtime."""
    import numpy as np

    block, blocks = 32, 64
    caches = [torch.randn(blocks, 1, block, 2 * 8) for _ in range(2)]
    rt = KVFlashRuntime(PagerConfig(pool_tokens=96, chunk_tokens=16, recent_chunks=2), "lru", caches, PACKED_LAYOUT,
                        8, block, 4, log_choices=log_choices)
    rows = np.zeros((4, blocks), dtype=np.int32)
    rows[0, : 3 + lent_blocks] = np.arange(1, 4 + lent_blocks)
    for step in range(steps):
        rt.plan(["r"], np.array([0, 48]), np.array([48 * step]), rows, np.array([3 + lent_blocks]),
                np.array([48 * steps]))
    return rt


def test_with_log_choices_a_paged_request_logs_its_chunk_choices_once_when_it_ends(luce_log):
    from vllm_luce.kvflash.choices import parse

    def logged():
        return [r.getMessage() for r in luce_log.records if "KVFlash chunk choices" in r.getMessage()]

    paged_run().release(["r"])
    assert logged() == []  # off by default
    rt = paged_run(log_choices=True)
    rt.release(["r"])
    rt.release(["r"])  # released once
    (request, entries), = parse("\n".join(logged())).items()
    assert request == "r" and len(entries) >= 5 and all(position % 48 == 0 for position, _, _ in entries), entries


def test_every_chunk_is_placed_and_host_memory_stays_within_the_reservation():
    for lent in (0, 2, 40):  # host memory only; some cold blocks; cold blocks for every chunk
        stats = paged_run(lent_blocks=lent).stats()
        assert stats["page_outs"] > 0 and stats["lost"] == 0 and stats["host_over_reserved"] == 0, (lent, stats)
        assert (stats["bytes_out"] == 0) == (lent == 40), stats


def test_a_chunk_put_in_host_memory_while_a_lent_block_was_free_is_counted_and_logged(monkeypatch, luce_log):
    """Planted: the pager ignores the blocks the scheduler lent it, so it holds host memory the scheduler never
    reserved (the scheduler counted those chunks in the lent blocks)."""
    from vllm_luce.kvflash.pager import RequestPager

    monkeypatch.setattr(RequestPager, "_take_cold", lambda self: None)
    stats = paged_run(lent_blocks=40).stats()
    assert stats["host_over_reserved"] > 0 and stats["lost"] == 0
    assert sum("more than the scheduler reserved" in r.getMessage() for r in luce_log.records) == 1


def test_a_chunk_paged_out_to_nowhere_is_counted_as_lost_and_logged(monkeypatch, luce_log):
    """Planted: a host page-out that forgets its bytes (the chunk leaves the pool and is found nowhere)."""
    from vllm_luce.kvflash.pager import RequestPager

    page_out = RequestPager._page_out

    def forgetful(self, chunk):
        page_out(self, chunk)
        self.host.pop(chunk, None)

    monkeypatch.setattr(RequestPager, "_page_out", forgetful)
    stats = paged_run().stats()
    assert stats["lost"] >= 1
    assert sum("chunks but places" in r.getMessage() for r in luce_log.records) == 1
