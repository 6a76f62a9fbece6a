"""The pinned chunk pool: views of slabs, returned when unreferenced, reused only after their copies."""

import gc
import time

import torch

from vllm_luce.kvflash.host_pool import PinnedChunkPool


def pool(**kw) -> PinnedChunkPool:
    return PinnedChunkPool((3, 5, 7), torch.bfloat16, pin=False, slab_bytes=4 * 3 * 5 * 7 * 2, **kw)


def test_views_are_distinct_chunks_of_one_slab_until_it_is_full():
    p = pool(background=False)
    views = [p.take() for _ in range(4)]
    assert p.slab_chunks == 4 and len(p.slabs) == 1 and p.pinned_bytes == 4 * 3 * 5 * 7 * 2
    for i, v in enumerate(views):
        v.fill_(i)
    assert [int(v[0, 0, 0]) for v in views] == [0, 1, 2, 3] and all(v.shape == (3, 5, 7) for v in views)
    views.append(p.take())  # a fifth grows a second slab on demand
    assert len(p.slabs) == 2 and p.grown_on_demand == 2


def test_a_dropped_view_is_reused_and_a_held_one_is_not():
    p = pool(background=False)
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
    p, copy = pool(background=False), _Copy()
    p.record_event = lambda: copy
    views = [p.take() for _ in range(4)]
    first = views[0].data_ptr()
    views[0] = None
    gc.collect()
    held = [p.take()]
    assert held[0].data_ptr() != first and len(p.slabs) == 2  # its copy may still run: a new slab instead
    copy.done = True
    held += [p.take() for _ in range(4)]
    assert first in {v.data_ptr() for v in held} and len(p.slabs) == 2


def wait_for_slabs(p: PinnedChunkPool, n: int) -> None:
    for _ in range(200):
        if len(p.slabs) == n:
            return
        time.sleep(0.01)


def test_the_background_thread_pins_the_first_slab_on_a_miss_and_the_next_ahead():
    p = pool()
    assert p.take() is None and p.misses == 1  # the runtime's warm-up takes this miss at startup
    wait_for_slabs(p, 1)
    views = [p.take() for _ in range(3)]  # 1 free of 4: below half a slab
    wait_for_slabs(p, 2)
    assert len(p.slabs) == 2 and p.grown_in_background == 2 and all(v is not None for v in views) and p.misses == 1


def test_with_the_background_thread_a_take_never_waits_for_pinning():
    p, pinned = pool(), []
    p._grow_in_background = lambda: pinned.append(True)  # the thread is late: nothing is pinned yet
    p._add_slab(p._new_slab())
    views = [p.take() for _ in range(4)]
    assert all(v is not None for v in views) and p.take() is None and p.misses == 1
    assert len(p.slabs) == 1 and p.grown_on_demand == 0 and pinned  # asked the thread for the next slab
    p._add_slab(p._new_slab())  # the thread's slab lands
    assert p.take() is not None and p.misses == 1


def test_reserve_pins_whole_slabs_now_and_takes_then_find_them():
    p, asked = pool(), []
    p._grow_in_background = lambda: asked.append(True)
    slab = 4 * 3 * 5 * 7 * 2
    p.reserve(slab + 1)  # rounds up to whole slabs
    assert len(p.slabs) == 2 and p.pinned_bytes == 2 * slab and p.misses == 0
    views = [p.take() for _ in range(8)]
    assert all(v is not None for v in views) and p.misses == 0
    p.reserve(slab)  # already held: nothing more
    assert len(p.slabs) == 2
