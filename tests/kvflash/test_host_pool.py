"""The pinned chunk pool: slabs pinned at startup, views returned when unreferenced and reused only after their
copies, never grown while serving."""

import gc

import torch

from vllm_luce.kvflash.host_pool import PinnedChunkPool

SLAB = 4 * 3 * 5 * 7 * 2  # bytes of 4 chunks


def pool(slabs: int = 1) -> PinnedChunkPool:
    p = PinnedChunkPool((3, 5, 7), torch.bfloat16, pin=False, slab_bytes=SLAB)
    p.reserve(slabs * SLAB)
    return p


def test_views_are_distinct_chunks_of_the_reserved_slabs_and_then_none():
    p = pool()
    views = [p.take() for _ in range(4)]
    assert p.slab_chunks == 4 and len(p.slabs) == 1 and p.pinned_bytes == SLAB
    for i, v in enumerate(views):
        v.fill_(i)
    assert [int(v[0, 0, 0]) for v in views] == [0, 1, 2, 3] and all(v.shape == (3, 5, 7) for v in views)
    assert p.take() is None and p.misses == 1 and len(p.slabs) == 1  # full: no slab pinned while serving


def test_a_pool_with_nothing_reserved_hands_out_nothing():
    p = pool(slabs=0)
    assert p.take() is None and p.take() is None and p.misses == 2 and p.pinned_bytes == 0


def test_a_dropped_view_is_reused_and_a_held_one_is_not():
    p = pool()
    a, b = p.take(), p.take()
    a_ptr, b_ptr = a.data_ptr(), b.data_ptr()
    del a
    gc.collect()
    ptrs = {p.take().data_ptr() for _ in range(3)}  # a's slot and the two never used
    assert a_ptr in ptrs and b_ptr not in ptrs and len(p.slabs) == 1


class _Copy:
    """Stands for an event on the copy stream: completed once ``done``."""

    def __init__(self):
        self.done = False

    def query(self):
        return self.done


def test_a_returned_view_waits_for_its_copy_event():
    p, copy = pool(), _Copy()
    p.record_event = lambda: copy
    views = [p.take() for _ in range(4)]
    first = views[0].data_ptr()
    views[0] = None
    gc.collect()
    assert p.take() is None  # its copy may still run
    copy.done = True
    again = p.take()
    assert again is not None and again.data_ptr() == first and p.misses == 1


def test_reserve_pins_whole_chunks_and_only_what_is_missing():
    p = PinnedChunkPool((3, 5, 7), torch.bfloat16, pin=False, slab_bytes=SLAB)
    chunk = 3 * 5 * 7 * 2
    p.reserve(SLAB + 1)  # a whole slab, then one chunk: exactly what the host ledger holds for it
    assert len(p.slabs) == 2 and p.pinned_bytes == SLAB // chunk * chunk + chunk
    views = [p.take() for _ in range(SLAB // chunk + 1)]
    assert all(v is not None for v in views) and p.misses == 0 and p.take() is None
    p.reserve(SLAB)  # already held: nothing more
    assert len(p.slabs) == 2
