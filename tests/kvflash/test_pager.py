"""KVFlash pager core (pure): bounded residency, protected chunks, bit-exact paging, policies."""

import pytest
import torch

from vllm_luce.kvflash.pager import KVFlashConfigError, PagerConfig, RequestPager
from vllm_luce.kvflash.pool_store import TensorStore
from vllm_luce.kvflash.policies import LRU, QK, Scorer, qk_scores

CHUNK = 4
SHAPE = (2, CHUNK, 3, 8)  # K and V, tokens, kv heads, head dim


def pager(pool_chunks=8, cold_chunks=0, **kw):
    """A pager over a store of the pool's positions and ``cold_chunks`` more (blocks beyond the pool)."""
    cfg = PagerConfig(pool_tokens=pool_chunks * CHUNK, chunk_tokens=CHUNK, **kw)
    return RequestPager(cfg, TensorStore(pool_chunks + cold_chunks, SHAPE))


def token_value(position):
    """The bytes the 'model' writes for a logical token: a function of its position only."""
    return torch.full(SHAPE[:1] + SHAPE[2:], float(position % 251), dtype=torch.bfloat16)


def grow(p, tokens, policy, decoded=0, prompt_end=False):
    """One step: as the worker does, write each new token at the pool offset ``prepare`` returns."""
    start = p.num_tokens
    offsets = p.prepare(start, tokens, policy, decoded=decoded, prompt_end=prompt_end)
    for pos, off in zip(range(start, start + tokens), offsets):
        p.store.data[off // CHUNK][:, off % CHUNK] = token_value(pos)
    return offsets


def assert_pool_holds_logical_tokens(p):
    """Compaction: resident chunk i holds its logical tokens at pool position i."""
    for i, chunk in enumerate(p.resident):
        for t in range(CHUNK):
            pos = chunk * CHUNK + t
            if pos < p.num_tokens:
                assert torch.equal(p.store.data[i][:, t], token_value(pos)), (chunk, t)


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


def test_residency_is_bounded_protected_chunks_stay_and_the_pool_stays_compact():
    p, lru = pager(), LRU()
    for step in range(60):  # 60 chunks through an 8-chunk pool, in uneven steps
        grow(p, CHUNK if step % 3 else CHUNK + 1, lru)
        assert len(p.resident) <= p.config.pool_chunks
        assert p.protected() <= set(p.resident)
        assert p.resident == sorted(p.resident)
        assert_pool_holds_logical_tokens(p)
    assert len(p.resident) + len(p.host) == p.num_chunks
    assert p.stats.page_outs == len(p.host)


def test_resident_tokens_and_offsets_follow_logical_order():
    p, lru = pager(), LRU()
    for _ in range(12):
        grow(p, CHUNK, lru)
    offsets = grow(p, 3, lru)
    # at an epoch's start (2 chunks here) the pager made room for the whole epoch: 7 resident chunks, the last one
    # partial (3 tokens): attention reads 6 full chunks + 3 tokens
    assert p.resident_tokens() == 6 * CHUNK + 3
    assert offsets == [6 * CHUNK, 6 * CHUNK + 1, 6 * CHUNK + 2]


def test_page_out_then_in_is_bit_exact():
    p, qk = pager(), QK()
    layers, hq, hkv, d = 1, 3, 3, 8
    for _ in range(20):
        grow(p, CHUNK, LRU())
    for c in sorted(p.host):  # host copies are the bytes written
        for t in range(CHUNK):
            assert torch.equal(p.host[c][:, t], token_value(c * CHUNK + t))
    target = sorted(p.host)[0]
    p.summaries = {c: torch.randn(layers, hkv, d) for c in range(p.num_chunks)}
    p.queries = p.summaries[target] * 5.0  # the query points at the paged-out chunk
    grow(p, 1, qk, prompt_end=True)
    assert target in p.resident and p.stats.page_ins >= 1
    assert_pool_holds_logical_tokens(p)  # paged back in, bit for bit, at its logical position


def test_a_step_must_fit_the_pool():
    p, lru = pager(), LRU()
    grow(p, p.config.max_step_tokens, lru)
    grow(p, p.config.max_step_tokens, lru)
    with pytest.raises(RuntimeError, match="write at most"):
        grow(p, 8 * CHUNK, lru)


def test_rejected_drafts_and_restarts_truncate_by_logical_position():
    p, lru = pager(), LRU()
    for _ in range(12):
        grow(p, CHUNK, lru)
    p.prepare(p.num_tokens, 5, lru)  # a verify step: 5 positions written
    keep = p.num_tokens - 4  # 4 drafts rejected: the next step starts at the first rejected one
    offsets = p.prepare(keep, 2, lru)
    assert p.num_tokens == keep + 2 and offsets[0] == p.pool_offset(keep)
    p.prepare(0, 3, lru)  # a restart after preemption: everything from position 0 again
    assert p.resident == [0] and not p.host and p.num_tokens == 3


def test_lru_keeps_sinks_and_the_recent_window():
    p, lru = pager(), LRU()
    for _ in range(30):
        grow(p, CHUNK, lru)
    assert p.resident == [0] + list(range(23, 30))


def test_qk_evicts_what_the_query_ignores():
    p, qk = pager(), QK()
    layers, hq, hkv, d = 2, 6, 3, 8
    g = torch.Generator().manual_seed(0)
    for _ in range(8):
        grow(p, CHUNK, qk)
    p.summaries = {c: torch.randn(layers, hkv, d, generator=g) for c in range(8)}
    favourite = 2
    p.queries = p.summaries[favourite].repeat_interleave(hq // hkv, dim=1)
    grow(p, CHUNK, qk)  # an epoch of 2 chunks starts: room for both
    assert favourite in p.resident and len(p.host) == 2


def test_qk_scores_group_query_heads_on_their_kv_head():
    keys = torch.zeros(2, 1, 2, 4)
    keys[0, 0, 0, 0] = 1.0  # chunk 0: KV head 0 points along axis 0
    keys[1, 0, 1, 1] = 1.0  # chunk 1: KV head 1 along axis 1
    q = torch.zeros(1, 4, 4)
    q[0, 3, 1] = 1.0  # query head 3 (group of KV head 1) along axis 1
    s = qk_scores(q, keys)
    assert s[1] > s[0]


def test_qk_reduce_max_makes_ranks_agree():
    """Two 'ranks' holding half the heads each agree after a MAX all-reduce of per-layer scores."""
    g = torch.Generator().manual_seed(1)
    q, keys = torch.randn(2, 4, 8, generator=g), torch.randn(5, 2, 2, 8, generator=g)
    full = qk_scores(q, keys)
    halves = [(q[:, :2], keys[:, :, :1]), (q[:, 2:], keys[:, :, 1:])]
    from vllm_luce.kvflash.policies import qk_layer_scores
    per_rank = [qk_layer_scores(a, b) for a, b in halves]
    reduced = torch.maximum(*per_rank).mean(dim=-1)
    assert torch.allclose(full, reduced)


@pytest.mark.parametrize("window", [1, 2, 8])
def test_decode_steps_want_queries_in_the_window_before_each_scoring_and_not_between(window):
    """The worker pushes a decode step's queries only where ``wants_queries``; every eviction or reselection that
    scores at a decode step must have had the ``window`` steps before it (this one included) pushed."""
    scoring_steps, wanted = [], []

    class Recording(LRU):
        def scores(self, pager_, chunks):
            scoring_steps.append(len(wanted) - 1)
            return super().scores(pager_, chunks)

    p, policy = pager(pool_chunks=8, tau_min=6), Recording()
    for _ in range(4):  # the prompt, in steps of 10 tokens: 10 chunks through a pool of 8
        grow(p, 10, policy)
    scoring_steps.clear()
    for _ in range(300):
        wanted.append(p.wants_queries(window))
        grow(p, 1, policy, decoded=1)
    assert len(scoring_steps) > 20
    for s in scoring_steps:
        assert all(wanted[max(0, s - window + 1): s + 1]), (s, wanted[max(0, s - window + 1): s + 1])
    if window < CHUNK - 1:  # a window shorter than a chunk skips steps between (CHUNK is 4 here, 64 by default)
        assert wanted.count(False) > 40, wanted.count(False)


def test_a_reselection_first_lets_the_step_before_finish_on_the_device():
    """Its scores' copy to the host waits for the device anyway; ``settle`` keeps that wait (a whole prefill chunk
    under asynchronous scheduling) out of the reselection's measured time, and runs only where one reselects."""
    p = pager(tau_min=16)
    settled = []
    p.store.settle = lambda: settled.append(p.stats.reselections)
    for _ in range(11):
        grow(p, CHUNK, LRU())
    grow(p, 3, LRU())
    assert settled == []
    grow(p, 1, LRU(), prompt_end=True)  # the prompt's last token reselects
    assert settled == [0] and p.stats.reselections == 1


def test_a_request_within_its_pool_neither_waits_for_the_device_nor_counts_a_reselection():
    p = pager(pool_chunks=8, tau_min=4)
    settled = []
    p.store.settle = lambda: settled.append(p.num_tokens)
    grow(p, 5 * CHUNK, LRU())  # 5 of 8 chunks: nothing paged out
    for _ in range(12):
        grow(p, 1, LRU(), decoded=1)  # every 4th position would reselect
    assert not p.host and settled == [] and p.stats.reselections == 0
    for _ in range(3):
        grow(p, CHUNK, LRU())  # past the pool: chunks go to the host, and each step starts at a reselection
    assert p.host and p.stats.reselections >= 1 and len(settled) == p.stats.reselections


def test_scorer_hook_and_release():
    p = pager()
    scorer = Scorer(lambda pager_, chunks: torch.tensor([-float(c) for c in chunks]))  # prefer early chunks
    for _ in range(20):
        grow(p, CHUNK, scorer)
    # besides the recent tails (after the step, and before the epoch's start), the resident chunks are early ones
    kept = [c for c in p.resident if c not in p.protected() | p.protected(p.num_chunks - 2)]
    assert kept and max(kept) < 8
    assert p.release() > 0 and not p.host and not p.resident and p.num_tokens == 0


def test_host_budget_drops_chunks_instead_of_growing_and_the_rest_stays_exact():
    """With room for 3 host chunks, later evictions are dropped (counted), host bytes stay bounded and
    the chunks that were paged out still come back bit-exact."""
    chunk_bytes = 2 * CHUNK * 3 * 8 * 2  # K and V, tokens, heads, dim, bf16
    budget = 3 * chunk_bytes
    p, lru = pager(), LRU()
    p.host_allowance = lambda nbytes: p.host_bytes() + nbytes <= budget  # the first page-out asks with its bytes too
    for _ in range(20):
        grow(p, CHUNK, lru)
    assert p.host_bytes() == budget == sum(t.numel() * t.element_size() for t in p.host.values())
    assert p.stats.page_outs == 3 and p.stats.dropped == 20 - 8 - 3
    for c, data in p.host.items():
        for t in range(CHUNK):
            assert torch.equal(data[:, t], token_value(c * CHUNK + t))
    dropped = set(range(20)) - set(p.resident) - set(p.host)
    assert len(dropped) == p.stats.dropped and not dropped & set(p.summaries)
    assert p.release() == budget and p.host_bytes() == 0


def chunk_holds(p, chunk, data):
    return all(torch.equal(data[:, t], token_value(chunk * CHUNK + t)) for t in range(CHUNK))


def test_cold_chunks_fill_the_store_beyond_the_pool_before_host_memory():
    p, lru = pager(cold_chunks=5), LRU()
    for _ in range(20):
        grow(p, CHUNK, lru)
    assert len(p.cold) == 5 and len(p.host) == 20 - 8 - 5 and p.stats.page_outs == 12 and p.stats.cold_outs == 5
    assert sorted(p.cold.values()) == list(range(8, 13))  # the positions after the pool's
    for chunk, position in p.cold.items():  # moved inside the store, bit for bit
        assert chunk_holds(p, chunk, p.store.data[position])
    assert p.host_bytes() == 7 * p.store.chunk_nbytes() and p.stats.bytes_out == p.host_bytes()
    assert_pool_holds_logical_tokens(p)


def test_a_swap_with_the_cold_positions_full_moves_chunks_both_ways_and_needs_no_host_memory():
    """A reselection with every cold position in use: its page-ins free their positions before its page-outs take
    them, so the swap stays inside the store, and every chunk comes back bit-exact."""
    torch.manual_seed(0)  # summaries below: the wanted chunks outscore the resident ones whatever ran before
    p, qk = pager(cold_chunks=4), QK()
    layers, hkv, d = 1, 3, 8
    for _ in range(11):  # 12 chunks, the last one partial (the decode token below stays in it): 8 resident, 4 cold
        grow(p, CHUNK, LRU())
    grow(p, 2, LRU())
    assert len(p.cold) == 4 and not p.host
    wanted = sorted(p.cold)[:2]
    p.summaries = {c: torch.randn(layers, hkv, d) for c in range(p.num_chunks)}
    p.queries = (p.summaries[wanted[0]] + p.summaries[wanted[1]]) * 5.0
    grow(p, 1, qk, prompt_end=True)
    assert set(wanted) <= set(p.resident) and len(p.cold) == 4 and not p.host and p.stats.cold_ins >= 1
    assert_pool_holds_logical_tokens(p)
    for chunk, position in p.cold.items():
        assert chunk_holds(p, chunk, p.store.data[position])


def test_a_swap_with_the_host_budget_full_drops_nothing():
    """host_full "drop": a reselection's page-ins give their host bytes back before its page-outs ask for bytes, so a
    swap at a full budget pages out instead of dropping."""
    p, qk = pager(), QK()
    budget = 4 * p.store.chunk_nbytes()
    p.host_allowance = lambda nbytes: p.host_bytes() + nbytes <= budget
    for _ in range(11):  # 12 chunks, the last partial: 4 paged out, the budget full
        grow(p, CHUNK, LRU())
    grow(p, 2, LRU())
    assert p.host_bytes() == budget and p.stats.dropped == 0
    p.summaries = {c: torch.randn(1, 3, 8) for c in range(p.num_chunks)}
    target = sorted(p.host)[0]
    p.queries = p.summaries[target] * 5.0
    grow(p, 1, qk, prompt_end=True)
    assert target in p.resident and p.stats.page_ins >= 1
    assert p.stats.dropped == 0 and p.host_bytes() == budget
    assert_pool_holds_logical_tokens(p)


def test_truncation_and_release_give_cold_positions_back():
    p, lru = pager(cold_chunks=6), LRU()
    for _ in range(14):
        grow(p, CHUNK, lru)
    assert len(p.cold) == 6
    p.prepare(0, 3, lru)  # a restart after preemption
    assert not p.cold and sorted(p.cold_free) == list(range(8, 14))
    for _ in range(13):  # 55 tokens: 14 chunks, 6 of them cold again
        grow(p, CHUNK, lru)
    assert sorted(p.cold.values()) == list(range(8, 14)) and p.cold_next == 14  # the same positions, reused
    p.release()
    assert not p.cold and not p.cold_free and p.cold_next == -1


def test_a_request_s_first_page_out_asks_the_budget_with_its_bytes():
    """host_full "drop" with the budget already spent by other requests: the first chunk this request evicts is
    dropped, not paged out (it asked with 0 bytes before, and went over the budget)."""
    p, lru = pager(), LRU()
    budget = 4 * p.store.chunk_nbytes()
    others = budget  # what the worker's other requests hold
    p.host_allowance = lambda nbytes: others + p.host_bytes() + nbytes <= budget
    for _ in range(10):
        grow(p, CHUNK, lru)
    assert p.host_bytes() == 0 and p.stats.dropped == 2


def test_a_step_that_writes_several_chunks_and_reselects_scores_only_chunks_written_before_it():
    """A step the scheduler did not cut at the decision positions (a resumed request's recompute of its prompt and
    output, with another scheduler) writes many chunks from a reselection position. They have no bytes (nor
    summary) until the step runs: only chunks complete before it are scored and may be swapped out."""
    p = pager(pool_chunks=8, tau_min=4)
    p.prompt_tokens = 18  # position 20 reselects (a multiple of the interval, 4, after the prompt)
    p.queries = torch.randn(2, 6, SHAPE[-1])
    policy = QK()
    step = p.config.max_step_tokens  # 5 chunks
    grow(p, step, policy)  # the prompt and two outputs: nothing paged out yet
    grow(p, step, policy)  # 5 new chunks past a pool of 8: 2 paged out, then a reselection
    assert p.stats.page_outs >= 2 and p.stats.reselections == 1 and p.stats.uncut_decisions >= 1
    written = set(range(step // CHUNK, 2 * step // CHUNK))
    assert not written & set(p.paged_out())  # nothing written by the step left the pool in it
    assert_pool_holds_logical_tokens(p)


def cut_store(p, capacity):
    """The row shrinks to ``capacity`` positions, as when the scheduler takes lent blocks back: the positions beyond
    go to another request (poisoned) and the store no longer reads them."""
    p.store.data[capacity:] = float("nan")
    p.store.data = p.store.data[:capacity].clone()


def test_giving_blocks_back_moves_cold_chunks_below_the_cut_then_to_host_memory_bit_exact():
    p, lru = pager(cold_chunks=6), LRU()
    for _ in range(14):
        grow(p, CHUNK, lru)
    p.prepare(0, 3, lru)  # a restart frees positions 8..13; regrowing takes them back from the top
    for _ in range(10):  # 43 tokens, 11 chunks: 8 resident, 3 cold at positions 13, 12, 11; 8, 9, 10 free
        grow(p, CHUNK, lru)
    assert sorted(p.cold.values()) == [11, 12, 13] and sorted(p.cold_free) == [8, 9, 10]
    p.store.data[8:11] = float("nan")  # free positions hold nothing of use
    assert p.give_back(12) == 0  # positions 12 and 13 move down into free ones: nothing to host memory
    cut_store(p, 12)
    assert sorted(p.cold.values()) == [9, 10, 11] and not p.host and p.stats.moves >= 2
    assert p.give_back(9) == 2 and p.stats.demotions == 2  # one free position below 9 (8), two chunks to host
    cut_store(p, 9)
    assert sorted(p.cold.values()) == [8] and len(p.host) == 2
    assert p.host_bytes() == 2 * p.store.chunk_nbytes()
    for chunk, position in p.cold.items():
        assert chunk_holds(p, chunk, p.store.data[position])
    for chunk, data in p.host.items():  # copies, taken before the blocks changed hands
        assert chunk_holds(p, chunk, data)
    for _ in range(3):  # growth goes on within the smaller row: the next page-outs go to host memory
        grow(p, CHUNK, lru)
    assert len(p.cold) == 1 and len(p.host) == 5 and p.stats.lost == 0
    assert_pool_holds_logical_tokens(p)


def test_giving_back_blocks_no_cold_chunk_uses_changes_nothing():
    p, lru = pager(cold_chunks=6), LRU()
    for _ in range(10):  # 2 cold chunks at 8, 9
        grow(p, CHUNK, lru)
    before, moves = dict(p.cold), p.stats.moves
    assert p.give_back(10) == 0 and p.cold == before and p.cold_next == 10 and p.stats.moves == moves


def swap_back_in(p, chunk):
    """A reselection that pages ``chunk`` back in (its summary is the query's)."""
    p.summaries = {c: torch.randn(1, 3, 8) for c in range(p.num_chunks)}
    p.queries = p.summaries[chunk] * 5.0
    grow(p, 1, QK(), prompt_end=True)
    assert chunk in p.resident


@pytest.mark.parametrize("tier", ["host", "cold"])
def test_verify_pages_counts_a_chunk_that_pages_back_in_with_other_bytes(tier, luce_log):
    """``luce.kvflash.verify_pages``: each page-out keeps a checksum; a page-in whose bytes differ (planted: one
    element of the chunk in host memory or at its cold position changed, or another chunk's bytes) is counted and
    logged once; bytes that come back as they went count nothing."""
    torch.manual_seed(0)
    for planted in (False, True):
        p = pager(cold_chunks=4 if tier == "cold" else 0)
        p.page_sums = {}
        for _ in range(11):
            grow(p, CHUNK, LRU())
        grow(p, 2, LRU())
        away = sorted(p.cold if tier == "cold" else p.host)[0]
        assert away in p.page_sums and len(p.page_sums) == len(p.paged_out())
        if planted:
            data = p.store.data[p.cold[away]] if tier == "cold" else p.host[away]
            data.view(-1)[5] += 1
        swap_back_in(p, away)
        assert chunk_holds(p, away, p.store.data[p.stored_at[away]]) != planted
        assert p.stats.page_mismatches == int(planted) and away not in p.page_sums
    assert sum("bytes differ from those paged out" in r.getMessage() for r in luce_log.records) == 1


def test_a_chunk_checksum_tells_other_bytes_and_the_same_bytes_in_another_order():
    from vllm_luce.kvflash.pool_store import checksum

    data = torch.randn(2, 4, 3, 8).to(torch.bfloat16)
    assert checksum(data) == checksum(data.clone())
    assert checksum(data.flip(1)) != checksum(data) and checksum(data * 2) != checksum(data)


@pytest.mark.parametrize("seed", [1, 4, 6])
def test_a_chunk_evicted_to_a_cold_position_and_taken_back_in_the_same_step_keeps_its_bytes(seed):
    """At a decode decision the eviction may choose a chunk that the reselection right after it takes back (their
    candidates differ: the recent tail before the step is protected from the eviction only). A page-out to a cold
    position moves the bytes at the step's rearrangement, so the page-in must read them where they still are, not
    at the cold position they never reached (it read that position's old bytes: another chunk's, or none).
    Chunk scores drawn per seed; these seeds met the case."""
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(64, generator=g)
    p = pager(pool_chunks=8, cold_chunks=4)
    p.page_sums, p.prompt_tokens = {}, 7 * CHUNK + 2
    policy = Scorer(lambda pager_, chunks: torch.stack([table[c] for c in chunks]))
    grow(p, 7 * CHUNK + 1, policy)
    grow(p, 1, policy, prompt_end=True)
    for _ in range(60):
        grow(p, 1, policy, decoded=1)
        assert_pool_holds_logical_tokens(p)
    assert p.stats.page_ins > 0 and p.stats.page_mismatches == 0
    for chunk, position in p.cold.items():
        assert chunk_holds(p, chunk, p.store.data[position])
