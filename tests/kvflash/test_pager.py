"""KVFlash pager core (pure): bounded residency, protected chunks, bit-exact paging, policies."""

import pytest
import torch

from vllm_luce.kvflash.pager import KVFlashConfigError, PagerConfig, RequestPager, TensorStore
from vllm_luce.kvflash.policies import LRU, QK, Scorer, qk_scores

CHUNK = 4
SHAPE = (2, CHUNK, 3, 8)  # K and V, tokens, kv heads, head dim


def pager(pool_chunks=8, **kw):
    cfg = PagerConfig(pool_tokens=pool_chunks * CHUNK, chunk_tokens=CHUNK, **kw)
    store = TensorStore(pool_chunks + 3, SHAPE)  # a shared pool; this request owns slots 3..
    return RequestPager(cfg, store, slots=list(range(3, 3 + pool_chunks)))


def fill(p, chunk, seed):
    """Write a chunk's bytes into its slot, as the worker does after ``append``."""
    data = torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    p.store.write(p.slot_of(chunk), data)
    return data


def grow(p, tokens, policy, written):
    before = p.num_chunks
    p.append(tokens, policy)
    for c in range(before, p.num_chunks):
        written[c] = fill(p, c, seed=c)


@pytest.mark.parametrize("bad, message", [
    (dict(pool_tokens=30), "positive multiple of chunk_tokens"),
    (dict(pool_tokens=0), "positive multiple"),
    (dict(pool_tokens=True), "positive multiple"),
    (dict(pool_tokens=6 * CHUNK), "expected at least 28"),  # 1 sink + 5 recent + 1 evictable
])
def test_bad_pools_name_the_key(bad, message):
    with pytest.raises(KVFlashConfigError, match=f"luce.kvflash.pool_tokens.*{message}"):
        PagerConfig(chunk_tokens=CHUNK, recent_chunks=5, **bad)


def test_sliding_window_widens_the_protected_tail():
    cfg = PagerConfig(pool_tokens=64, chunk_tokens=CHUNK, recent_chunks=4, sliding_window=30)
    assert cfg.recent_tail_chunks == 9  # ceil(30 / 4) + 1 (the window may straddle a chunk)


def test_residency_is_bounded_and_protected_chunks_stay():
    p, written, lru = pager(), {}, LRU()
    for _ in range(60):  # 60 chunks through an 8-chunk pool, a chunk at a time
        grow(p, CHUNK, lru, written)
        assert len(p.resident) <= p.config.pool_chunks
        assert p.protected() <= set(p.resident)
        assert set(p.resident.values()) <= set(p.slots)  # never a slot it does not own
    assert len(p.resident) + len(p.host) == 60 and p.stats.page_outs == 52


def test_page_out_then_in_is_bit_exact_in_any_slot():
    p, written, lru = pager(), {}, LRU()
    for _ in range(20):
        grow(p, CHUNK, lru, written)
    for c in sorted(p.host):  # host copies are the bytes written
        assert torch.equal(p.host[c], written[c])
    victim = p.evictable()[0]
    slot = p.page_out(victim)
    away = sorted(p.host)[0]
    p.page_in(away, slot)  # into another chunk's former slot
    assert torch.equal(p.store.read(slot), written[away])


def test_large_write_must_fit_the_pool():
    p, lru = pager(), LRU()
    p.append(7 * CHUNK, lru)
    with pytest.raises(RuntimeError, match="write at most"):
        p.append(8 * CHUNK, lru)


def test_lru_evicts_the_least_recently_used():
    p, written, lru = pager(), {}, LRU()
    for _ in range(8):
        grow(p, CHUNK, lru, written)
    p.touch([1])  # chunk 1 attended to now; chunk 2 is the oldest evictable
    grow(p, CHUNK, lru, written)
    assert 2 in p.host and 1 in p.resident


def test_qk_keeps_the_chunk_the_query_points_at_and_reselects_it_back():
    g = torch.Generator().manual_seed(0)
    p, written, qk = pager(), {}, QK()
    layers, hq, hkv, d = 2, 6, 3, 8
    for _ in range(30):
        grow(p, CHUNK, qk, written)
        for c in range(p.num_chunks):
            p.summaries.setdefault(c, torch.randn(layers, hkv, d, generator=g))
    target = sorted(p.host)[0]  # a chunk already paged out
    qk.observe(p.summaries[target].repeat_interleave(hq // hkv, dim=1) * 3.0)  # queries aligned with it
    assert p.reselect(qk) and target in p.resident
    grow(p, CHUNK, qk, written)
    assert target in p.resident  # the query still points at it: something else was evicted
    assert torch.equal(p.store.read(p.slot_of(target)), written[target])


def test_qk_scores_group_query_heads_on_their_kv_head():
    keys = torch.zeros(2, 1, 2, 4)
    keys[0, 0, 0, 0] = 1.0  # chunk 0: KV head 0 points along axis 0
    keys[1, 0, 1, 1] = 1.0  # chunk 1: KV head 1 along axis 1
    q = torch.zeros(1, 4, 4)
    q[0, 3, 1] = 1.0  # query head 3 (group of KV head 1) along axis 1
    s = qk_scores(q, keys)
    assert s[1] > s[0]


def test_reselection_interval_grows_with_history():
    p = pager(tau_min=16)
    p.num_tokens = 45 * 100
    p.note_decoded(99)
    assert not p.reselect_due()
    p.note_decoded(1)
    assert p.reselect_due()


def test_scorer_hook_and_release():
    p, written = pager(), {}
    scorer = Scorer(lambda pager_, chunks: torch.tensor([-float(c) for c in chunks]))  # prefer early chunks
    for _ in range(20):
        grow(p, CHUNK, scorer, written)
    assert max(c for c in p.resident if c not in p.protected()) < 8
    assert p.release() > 0 and not p.host and not p.resident and len(p.free) == p.config.pool_chunks
