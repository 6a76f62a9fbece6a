"""Drafter context writes held across plain steps (pure torch): the replay leaves every slot as the
per-step writes would, within the store's limits."""

import pytest
import torch

from vllm_luce.spec_decode.deferred_context import DeferredContext, last_writes


def test_last_writes_keeps_the_latest_of_each_slot():
    slots = torch.tensor([5, 9, 5, 3, 9, 5])
    keep = last_writes(slots)
    assert sorted(keep.tolist()) == [3, 4, 5]
    assert sorted(slots[keep].tolist()) == [3, 5, 9]


def replay(writes, cache_rows=32, width=3):
    """The cache after applying (features, slots) writes in order, one step at a time."""
    cache = torch.full((cache_rows, width), float("nan"))
    for features, slots in writes:
        cache[slots] = features
    return cache


def test_one_replay_equals_the_per_step_writes():
    g = torch.Generator().manual_seed(0)
    store = DeferredContext(max_tokens=100)
    writes = []
    # A rejected draft's slot (12) rewritten by the next step; a freed block's slots (20, 21) reused.
    for slots in ([10, 11, 12, 20, 21], [12, 13], [14, 20], [21, 15, 16]):
        s = torch.tensor(slots)
        f = torch.randn(len(slots), 3, generator=g)
        writes.append((f, s))
        store.hold(f, s * 2, s)  # positions: any per-token value travels with its row
    features, positions, slots = store.take()
    assert len(store) == 0 and store.tokens == 0 and store.take() is None
    assert torch.equal(positions, slots * 2)
    got = torch.full((32, 3), float("nan"))
    got[slots] = features
    assert torch.equal(got.nan_to_num(-1.0), replay(writes).nan_to_num(-1.0))


def test_hold_copies_and_the_limits_hold():
    store = DeferredContext(max_tokens=4, max_bytes=4 * 3 * 4)
    f = torch.ones(3, 3)
    store.hold(f, torch.arange(3), torch.arange(3))
    f.fill_(7.0)  # the caller reuses its buffer
    assert store.take()[0].eq(1.0).all()
    store.hold(torch.ones(3, 3), torch.arange(3), torch.arange(3))
    assert store.fits(torch.ones(1, 3)) and not store.fits(torch.ones(2, 3))
    assert not DeferredContext(max_tokens=100, max_bytes=8).fits(torch.ones(1, 3))  # 12 bytes > 8
    with pytest.raises(ValueError, match="one row per token"):
        store.hold(torch.ones(2, 3), torch.arange(3), torch.arange(3))
    with pytest.raises(ValueError, match="max_tokens"):
        DeferredContext(0)
