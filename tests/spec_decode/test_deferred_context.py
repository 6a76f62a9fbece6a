"""Drafter context writes held across plain steps (pure torch): the replay leaves every live slot as the
per-step writes would, drops writes to blocks no live request holds (their slot becomes vLLM's padding
slot, which its cache writes skip: checked against vLLM's CPU kernel), and keeps the store's limits."""

import pytest
import torch

from vllm_luce.spec_decode.deferred_context import (PADDING_SLOT, DeferredContext, DeferredContextByReference,
                                                    in_live_blocks, last_writes, pad_rows, padded_rows)

ALL_LIVE = torch.tensor([[1, 2, 3, 4]])  # blocks of 8 slots: slots 8-39
STORES = pytest.mark.parametrize("store_type", [DeferredContext, DeferredContextByReference],
                                 ids=["buffers", "by reference"])


def test_last_writes_keeps_the_latest_of_each_slot():
    slots = torch.tensor([5, 9, 5, 3, 9, 5])
    assert last_writes(slots).tolist() == [False, False, False, True, True, True]
    g = torch.Generator().manual_seed(3)
    slots = torch.randint(0, 40, (500,), generator=g)
    latest = {int(s): i for i, s in enumerate(slots)}
    assert last_writes(slots).nonzero().flatten().tolist() == sorted(latest.values())


def replay(writes, cache_rows=32, width=3):
    """The cache after applying (features, slots) writes in order, one step at a time."""
    cache = torch.full((cache_rows, width), float("nan"))
    for features, slots in writes:
        cache[slots] = features
    return cache


def write(cache, features, slots):
    """A cache write as vLLM's kernels do it: each row to its slot, padding slots skipped; at most one
    row per slot (a duplicate would land in an unspecified order)."""
    kept = slots != PADDING_SLOT
    assert slots[kept].unique().numel() == int(kept.sum())
    cache[slots[kept]] = features[kept]
    return cache


@STORES
def test_one_replay_equals_the_per_step_writes(store_type):
    g = torch.Generator().manual_seed(0)
    store = store_type(max_tokens=100)
    writes = []
    # A rejected draft's slot (12) rewritten by the next step; slots 20, 21 written twice.
    for slots in ([10, 11, 12, 20, 21], [12, 13], [14, 20], [21, 15, 16]):
        s = torch.tensor(slots)
        f = torch.randn(len(slots), 3, generator=g)
        writes.append((f, s))
        store.hold(f, s * 2, s)  # positions: any per-token value travels with its row
    features, positions, slots = store.take(ALL_LIVE, 8)
    assert len(store) == 0 and store.tokens == 0 and store.take(ALL_LIVE, 8) is None
    if store_type is DeferredContext:  # the first writes of 12, 20 and 21, rewritten later, are marked
        assert torch.equal(positions, torch.cat([s for _, s in writes]) * 2)  # every row, in order
        assert int((slots == PADDING_SLOT).sum()) == 3
    else:  # removed; the rest in order
        assert slots.tolist() == [10, 11, 12, 13, 14, 20, 21, 15, 16] and torch.equal(positions, slots * 2)
    got = write(torch.full((32, 3), float("nan")), features, slots)
    assert torch.equal(got.nan_to_num(-1.0), replay(writes).nan_to_num(-1.0))


def test_the_buffer_store_copies():
    store = DeferredContext(max_tokens=4)
    f, index = torch.ones(3, 3), torch.arange(3) + 8
    store.hold(f, index, index)
    f.fill_(7.0)  # the caller reuses its buffers (a GPU runner's CUDA graph outputs)
    index.fill_(30)
    features, positions, slots = store.take(ALL_LIVE, 8)
    assert features.eq(1.0).all() and positions.tolist() == slots.tolist() == [8, 9, 10]


def test_the_store_by_reference_keeps_the_features_and_copies_positions_and_slots():
    """On CPU a step's target features are new tensors; the runner's position and slot buffers are reused."""
    store = DeferredContextByReference(max_tokens=8)
    a, b, index = torch.randn(3, 2), torch.randn(3, 5), torch.tensor([8, 9, 10], dtype=torch.int32)
    assert store.hold([a, b], index, index)
    index.fill_(30)
    c = torch.randn(1, 7)
    assert store.hold(c, torch.tensor([3]), torch.tensor([11]))
    features, positions, slots = store.take(ALL_LIVE, 8)
    assert torch.equal(features, torch.cat([torch.cat([a, b], dim=-1), c]))
    assert positions.tolist() == [8, 9, 10, 3] and slots.tolist() == [8, 9, 10, 11] and slots.dtype == torch.long
    assert store.take(ALL_LIVE, 8) is None and not store.hold(torch.ones(9, 7), torch.arange(9), torch.arange(9))
    assert store.hold(torch.ones(1, 7), torch.arange(1), torch.arange(1))
    assert DeferredContextByReference(max_bytes=8 * 7 * 4).hold(torch.ones(8, 7), torch.arange(8), torch.arange(8))
    assert DeferredContextByReference().capacity(torch.ones(1, 3 * 4096, dtype=torch.bfloat16)) > 10_000
    with pytest.raises(ValueError, match="wide"):
        store.hold(torch.ones(1, 3), torch.arange(1), torch.arange(1))


@STORES
def test_the_limits_hold(store_type):
    store = store_type(max_tokens=4, max_bytes=4 * 3 * 4)
    assert store.hold(torch.ones(3, 3), torch.arange(3), torch.arange(3))
    assert not store.hold(torch.ones(2, 3), torch.arange(2), torch.arange(2)) and store.tokens == 3  # nothing held
    assert store.hold(torch.ones(1, 3), torch.arange(1), torch.arange(1)) and store.tokens == 4
    assert not store_type(max_tokens=100, max_bytes=8).hold(torch.ones(1, 3), torch.arange(1), torch.arange(1))  # 12 B
    with pytest.raises(ValueError, match="one row per token"):
        store.hold(torch.ones(2, 3), torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match="max_tokens"):
        store_type(0)


@STORES
def test_writes_to_blocks_no_live_request_holds_are_dropped(store_type):
    """A request finished or was preempted after its plain steps: its blocks may now hold another KV cache
    group's state (on hybrid targets the groups share memory), so its held writes must not land."""
    store = store_type(max_tokens=100)
    slots = torch.tensor([8, 9, 16, 17, 24, 40])  # blocks 1, 1, 2, 2, 3, 5 (8 slots per block)
    store.hold(torch.arange(6.0)[:, None], slots, slots)
    features, positions, kept = store.take(torch.tensor([[1, 0, 0], [3, 5, 0]]), 8)  # block 2 was freed
    if store_type is DeferredContext:  # marked with the padding slot
        assert kept.tolist() == [8, 9, -1, -1, 24, 40] and features.flatten().tolist() == [0, 1, 2, 3, 4, 5]
    else:  # removed, and nothing at all when nothing is live
        assert kept.tolist() == positions.tolist() == [8, 9, 24, 40] and features.flatten().tolist() == [0, 1, 4, 5]
    store.hold(torch.ones(2, 1), torch.tensor([16, 17]), torch.tensor([16, 17]))
    taken = store.take(torch.tensor([[1, 3]]), 8)
    assert len(store) == 0 and (taken is None if store_type is DeferredContextByReference
                                else taken[2].tolist() == [-1, -1])  # nothing live
    assert in_live_blocks(torch.tensor([0, 7, 8]), torch.tensor([[0, 1]]), 8).tolist() == [False, False, True]
    assert in_live_blocks(torch.tensor([8, 16]), torch.zeros(0, 4, dtype=torch.int32), 8).tolist() == [False, False]
    table = torch.tensor([[9, 4, 0], [2, 7, 0]], dtype=torch.int32)  # unsorted rows, int32 as vLLM keeps them
    slots = torch.arange(0, 10 * 8, 4)
    assert in_live_blocks(slots, table, 8).tolist() == [(int(s) // 8) in (9, 4, 2, 7) for s in slots]


def test_features_held_as_parts_are_concatenated_into_buffers_kept_across_steps():
    """The target layers' outputs are held as parts (concatenated on the last dimension, int32 slots
    widened), in buffers allocated once: a take reads them back and the next hold reuses them."""
    store = DeferredContext(max_tokens=8)
    a, b = torch.randn(3, 2), torch.randn(3, 5)
    store.hold([a, b], torch.arange(3), torch.tensor([8, 9, 10], dtype=torch.int32))
    store.hold(torch.randn(1, 7), torch.tensor([3]), torch.tensor([11]))
    features, positions, slots = store.take(ALL_LIVE, 8)
    assert torch.equal(features[:3], torch.cat([a, b], dim=-1)) and slots.dtype == torch.long
    assert slots.tolist() == [8, 9, 10, 11] and positions.tolist() == [0, 1, 2, 3]
    buffer = features.data_ptr()
    store.hold(torch.ones(2, 7), torch.arange(2), torch.tensor([12, 13]))
    again = store.take(ALL_LIVE, 8)[0]
    assert again.data_ptr() == buffer and again.eq(1.0).all()
    assert not store.hold(torch.ones(9, 7), torch.arange(9), torch.arange(9)) and store.tokens == 0  # over the limit
    assert store.hold(torch.ones(1, 7), torch.arange(1), torch.arange(1))
    with pytest.raises(ValueError, match="wide"):
        store.hold(torch.ones(1, 3), torch.arange(1), torch.arange(1))


@pytest.mark.parametrize("isa", ["vec", "vec16", pytest.param("amx", marks=pytest.mark.skipif(
    not torch.cpu._is_amx_tile_supported(), reason="vLLM runs its amx kernel only on AMX CPUs"))])
def test_vllms_cpu_cache_write_skips_the_padding_slot(isa):
    """What ``take`` relies on to drop a write without removing its row (CUDA's kernels skip negative
    slots too: vLLM pads drafter batches with them)."""
    ops = pytest.importorskip("vllm._custom_ops", reason="the check is of vLLM's CPU kernel")
    block, head, heads = 64, 32, 2
    cache = torch.zeros(3, heads, block, 2 * head, dtype=torch.bfloat16)
    key_cache, value_cache = cache.view(3, heads, 2 * block, head).chunk(2, dim=2)
    k, v = (torch.randn(3, heads, head).to(torch.bfloat16) for _ in range(2))
    ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, torch.tensor([5, PADDING_SLOT, 70]), isa)
    written = int((cache != 0).sum())
    assert written == 2 * 2 * heads * head, written  # two tokens' K and V, nothing for the padding row


@pytest.mark.parametrize("alike", [True, False])
def test_a_take_by_reference_keeps_the_live_rows_of_mixed_steps_in_order(alike):
    """Steps whose writes are all dropped are skipped before concatenating, the others' dropped rows removed:
    the same rows as concatenating every step and removing the dropped rows after."""
    g = torch.Generator().manual_seed(1)
    store = DeferredContextByReference(max_tokens=1000)
    held = []
    blocks = [[1, 2], [3], [1, 5], [6, 2, 6], [3, 3]]  # live blocks: 1, 2 and 6 (8 slots per block)
    for i, step in enumerate(blocks):
        slots = torch.tensor([b * 8 + i + 2 * j for j, b in enumerate(step)])  # no slot written twice
        widths = (2, 3) if alike or i % 2 else (4, 1)
        parts = [torch.randn(len(step), w, generator=g) for w in widths]
        held.append((torch.cat(parts, dim=-1), slots))
        store.hold(parts, slots + 100, slots)
    features, positions, slots = store.take(torch.tensor([[1, 2], [6, 0]]), 8)
    everything = torch.cat([f for f, _ in held])
    all_slots = torch.cat([s for _, s in held])
    want = torch.tensor([s // 8 in (1, 2, 6) for s in all_slots.tolist()])
    assert slots.tolist() == all_slots[want].tolist() and positions.tolist() == (all_slots[want] + 100).tolist()
    assert torch.equal(features, everything[want])


def test_context_writes_are_padded_to_row_counts_that_repeat():
    """Powers of two up to 4,096 rows, then at most 1/8 more rows (eight counts per power of two); the padding rows
    write nothing."""
    assert {padded_rows(n) for n in range(1, 4097)} == {1 << k for k in range(13)}  # powers of two up to 4096
    assert all(n <= padded_rows(n) < 2 * n for n in range(2, 4097))
    assert all(n <= padded_rows(n) <= n * 9 / 8 for n in range(4097, 40_000, 7))  # eighths beyond
    assert len({padded_rows(n) for n in range(4097, 32_769)}) == 8 * 3
    assert [padded_rows(n) for n in (1, 15, 16, 17, 129, 687, 4097, 5000)] == [1, 16, 16, 32, 256, 1024, 4608, 5120]
    features, positions, slots = torch.randn(129, 5), torch.arange(129) + 3, torch.arange(129) + 40
    f, p, s = pad_rows(features, positions, slots)
    assert f.shape == (256, 5) and torch.equal(f[:129], features) and f[129:].eq(0).all()
    assert torch.equal(p[:129], positions) and torch.equal(s[:129], slots) and s[129:].eq(PADDING_SLOT).all()
    unpadded = features[:128], positions[:128], slots[:128]  # already a size that repeats: returned as given
    assert all(a is b for a, b in zip(pad_rows(*unpadded), unpadded))


def test_a_take_by_reference_drops_finished_steps_whole_without_a_gather():
    """Steps of finished requests dropped whole and the others kept whole (a batch that finished together): the
    kept steps' rows, in order."""
    g = torch.Generator().manual_seed(2)
    store = DeferredContextByReference(max_tokens=1000)
    steps = [[1, 2], [3, 4], [1, 2], [3, 4], [1, 2]]  # blocks of 8 slots; blocks 3 and 4 were freed
    held = []
    for i, step in enumerate(steps):
        slots = torch.tensor([b * 8 + i for b in step])
        parts = [torch.randn(len(step), w, generator=g) for w in (2, 3)]
        held.append((torch.cat(parts, dim=-1), slots, i % 2 == 0))
        store.hold(parts, slots + 100, slots)
    features, positions, slots = store.take(torch.tensor([[1, 2]]), 8)
    assert torch.equal(features, torch.cat([f for f, _, live in held if live]))
    assert slots.tolist() == torch.cat([s for _, s, live in held if live]).tolist() == (positions - 100).tolist()


@pytest.mark.parametrize("alike", [True, False])
def test_making_room_keeps_what_a_take_would_write_and_holds_on_after_it(alike):
    """Making room drops the writes a take drops (finished requests', overridden ones) and holds the others as
    one step: held steps after it, then a take, write the same rows as one take of everything."""
    g = torch.Generator().manual_seed(4)
    steps = [[3, 4], [1, 3], [4, 4], [1, 2], [6, 2, 6], [1, 2]]  # blocks of 8 slots; 3 and 4 were freed
    table = torch.tensor([[1, 2], [6, 0]])
    stores = DeferredContextByReference(max_tokens=1000), DeferredContextByReference(max_tokens=1000)
    for i, step in enumerate(steps):
        slots = torch.tensor([b * 8 + i % 4 + 2 * j for j, b in enumerate(step)])  # step 5 overrides slot 9
        widths = (2, 3) if alike or i % 2 else (4, 1)
        parts = [torch.randn(len(step), w, generator=g) for w in widths]
        for store in stores:
            store.hold(parts, slots + 100, slots)
        if i == 3:
            assert stores[0].make_room(table, 8) is None and len(stores[0]) == 1 and stores[0].tokens == 3  # 9, 11, 21
    features, positions, slots = stores[0].take(table, 8)
    want = stores[1].take(table, 8)
    assert torch.equal(features, want[0]) and slots.tolist() == want[2].tolist()
    assert positions.tolist() == want[1].tolist() and slots.tolist().count(9) == 1  # the overridden write dropped


def test_a_full_store_keeps_its_live_rows_held_only_where_they_fill_at_most_half_of_it():
    """More than half live: every held write is taken, as ``take`` takes them. At most half: the live ones stay
    held, and a step whose rows are all kept stays as it is, not copied. The buffers' store always takes."""
    def filled():
        g = torch.Generator().manual_seed(5)
        store, first = DeferredContextByReference(max_tokens=10), torch.randn(4, 3, generator=g)
        store.hold(first, torch.arange(4), torch.tensor([8, 9, 16, 17]))  # blocks 1 and 2
        store.hold(torch.randn(5, 3, generator=g), torch.arange(5), torch.tensor([24, 25, 26, 27, 28]))  # block 3
        return store, first

    store, _ = filled()
    taken = store.make_room(torch.tensor([[1, 3]]), 8)  # 7 of 10 rows live
    want = filled()[0].take(torch.tensor([[1, 3]]), 8)
    assert store.tokens == 0 and len(taken[2]) == 7 and all(torch.equal(a, b) for a, b in zip(taken, want))
    store, first = filled()
    assert store.make_room(torch.tensor([[1, 2]]), 8) is None and store.tokens == 4 and len(store) == 1  # 4 of 10
    assert store._held[0][0] is first
    assert store.make_room(torch.tensor([[5]]), 8) is None and store.tokens == 0  # nothing live
    buffers = DeferredContext(max_tokens=10)
    buffers.hold(torch.ones(2, 3), torch.arange(2), torch.tensor([8, 9]))
    assert buffers.make_room(torch.tensor([[1]]), 8)[2].tolist() == [8, 9] and buffers.tokens == 0
