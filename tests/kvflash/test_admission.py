"""The scheduler's side of KVFlash's tiers: cold chunks in free KV blocks first, host memory reserved before any
page-out, requests held back instead of chunks dropped."""

from vllm_luce.kvflash.admission import AdmissionConfig, HostAdmission
from vllm_luce.kvflash.host_ledger import HostLedger

CHUNK_BYTES = 1000


def config(**kw):
    base = dict(chunk_tokens=64, pool_chunks=8, block_size=16, chunk_bytes=CHUNK_BYTES, request_bytes=10 * CHUNK_BYTES)
    return AdmissionConfig(**{**base, **kw})


def test_chunks_split_between_the_pool_free_blocks_and_host_memory():
    c = config()
    pool_blocks = 8 * 64 // 16
    assert c.host_chunks(8 * 64, pool_blocks) == 0  # the pool holds it
    assert c.host_chunks(8 * 64 + 1, pool_blocks) == 1  # one chunk beyond, no cold block
    assert c.cold_blocks_wanted(20 * 64, pool_blocks) == 12 * 4  # 12 cold chunks of 4 blocks
    assert c.host_chunks(20 * 64, pool_blocks + 12 * 4) == 0
    assert c.host_chunks(20 * 64, pool_blocks + 5 * 4 + 3) == 7  # 5 whole cold chunks in 23 blocks
    assert config(gpu_cold=False).cold_blocks_wanted(20 * 64, pool_blocks) == 0
    assert c.max_tokens() == (8 + 10) * 64 and c.max_tokens(lookahead=15) == 18 * 64 - 15


def test_blocks_that_do_not_divide_chunks_count_whole_positions_only():
    c = config(block_size=48)  # a chunk straddles blocks
    assert c.cold_chunks(11) == 11 * 48 // 64 - 8 == 0
    assert c.cold_chunks(14) == 2
    blocks = 11 + c.cold_blocks_wanted(10 * 64, 11)
    assert c.cold_chunks(blocks) >= 2 and c.host_chunks(10 * 64, blocks) == 0


def test_holds_commit_and_release_against_a_shared_budget(tmp_path):
    ledger = HostLedger(str(tmp_path / "ledger"), 5 * CHUNK_BYTES)
    a = HostAdmission(config(), ledger)
    assert a.hold("r1", 3 * CHUNK_BYTES) and a.hold("r2", 2 * CHUNK_BYTES)
    assert not a.hold("r3", 1) and a.end_step() == 1  # the budget is spent: r3 waits
    # one ledger change in the step (r1's claim took what the budget left, r2 fit inside it); it settles a step later
    assert a.ledger_touches == 1 and ledger.held() == 5 * CHUNK_BYTES
    assert a.end_step() == 0 and ledger.held() == 0 and a.total() == 0  # nothing was allocated: all went back
    assert a.hold("r1", 3 * CHUNK_BYTES)
    a.commit("r1", 3 * CHUNK_BYTES)
    assert a.end_step() == 0 and a.end_step() == 0 and ledger.held() == 3 * CHUNK_BYTES
    assert a.hold("r1", 1 * CHUNK_BYTES) and a.total() == 3 * CHUNK_BYTES  # a reservation never shrinks while it runs
    a.release("r1")
    assert a.end_step() == 0 and ledger.held() == 0


def test_the_ledger_is_touched_at_most_once_a_step_and_short_requests_never_touch_it(tmp_path):
    ledger = HostLedger(str(tmp_path / "ledger"), 1000 * CHUNK_BYTES)
    a = HostAdmission(config(request_bytes=100 * CHUNK_BYTES), ledger)
    for step in range(1, 6):
        touches = a.ledger_touches
        for r in range(200):
            assert a.hold(f"short{r}", 0)  # no host memory: no work beyond a lookup
            a.commit(f"short{r}", 0)
        for r in range(10):  # ten long requests grow by one chunk each: one claim covers them
            assert a.hold(f"long{r}", step * CHUNK_BYTES)
            a.commit(f"long{r}", step * CHUNK_BYTES)
        a.end_step()
        assert a.ledger_touches - touches <= 1 and a.total() == 10 * step * CHUNK_BYTES <= ledger.held()
    for r in range(10):
        a.release(f"long{r}")
    a.end_step()
    a.end_step()
    assert ledger.held() == 0 and a.total() == 0


def test_a_request_s_share_bounds_it_whatever_the_budget(tmp_path):
    a = HostAdmission(config(request_bytes=4 * CHUNK_BYTES), HostLedger(str(tmp_path / "ledger"), 100 * CHUNK_BYTES))
    assert a.hold("greedy", 4 * CHUNK_BYTES) and not a.hold("greedy", 5 * CHUNK_BYTES)
    assert a.pending["greedy"] == 4 * CHUNK_BYTES  # the refused ask left the earlier one in place
    assert a.hold("other", 4 * CHUNK_BYTES)


def test_the_children_of_a_request_for_n_samples_split_one_share_and_keep_it_through_preemption(tmp_path):
    a = HostAdmission(config(request_bytes=9 * CHUNK_BYTES), HostLedger(str(tmp_path / "ledger"), 100 * CHUNK_BYTES))
    assert a.config.max_tokens(family=3) == (8 + 3) * 64 and a.config.max_tokens() == (8 + 9) * 64
    for child in ("0_r", "1_r", "2_r"):
        a.join(child, 3)
    a.join("alone", 1)
    assert a.hold("0_r", 3 * CHUNK_BYTES) and not a.hold("1_r", 4 * CHUNK_BYTES)
    assert a.hold("alone", 9 * CHUNK_BYTES) and a.share_of("2_r") == 3 * CHUNK_BYTES
    a.end_step()
    assert a.take_expired(0.0) == [("1_r", "share")]  # beyond the third of the share: no wait admits it
    a.release("2_r")  # preempted: its share stays while it is the scheduler's
    assert a.share_of("2_r") == 3 * CHUNK_BYTES
    a.keep_shares({"0_r", "2_r", "alone"})  # 1_r ended
    assert a.shares == {"0_r": 3 * CHUNK_BYTES, "2_r": 3 * CHUNK_BYTES}


def test_pinned_memory_is_used_before_pageable(tmp_path):
    ledger = HostLedger(str(tmp_path / "ledger"), 10 * CHUNK_BYTES)
    assert ledger.hold("pinned", 4 * CHUNK_BYTES)  # the engine's worker pinned at startup
    a = HostAdmission(config(), ledger, pinned=4 * CHUNK_BYTES)
    assert a.hold("r", 4 * CHUNK_BYTES) and ledger.mine("pageable") == 0
    assert a.hold("r", 10 * CHUNK_BYTES) and ledger.mine("pageable") == 6 * CHUNK_BYTES
    assert not a.hold("s", 1)  # pinned 4 + pageable 6: the host's budget is spent


def test_engines_sharing_a_host_never_pass_its_budget(tmp_path):
    """Two engines (two processes' ledgers in this test: one per pid would be the same slot) take turns."""
    path = str(tmp_path / "ledger")
    first = HostAdmission(config(), HostLedger(path, 6 * CHUNK_BYTES))
    assert first.hold("a", 6 * CHUNK_BYTES)
    first.commit("a", 6 * CHUNK_BYTES)
    first.end_step()
    second_ledger = HostLedger(path, "auto")
    assert second_ledger.held() == 6 * CHUNK_BYTES and not second_ledger.hold("pinned", 1)
    first.release("a")
    first.settle()  # an engine with no reservation left gives its claim back at once (``engine_tiers.report``)
    assert second_ledger.hold("pinned", 6 * CHUNK_BYTES)


def test_without_a_ledger_reservations_are_counted_but_not_bounded():
    a = HostAdmission(config(request_bytes=10**12))
    assert a.hold("r", 7 * CHUNK_BYTES) and a.unbudgeted == 7 * CHUNK_BYTES
    a.release("r")
    assert a.unbudgeted == 0


def test_a_running_request_refused_and_preempted_counts_as_held_back(tmp_path):
    """vLLM preempts a running request whose step cannot be allocated, and releases it at once: it still counts."""
    a = HostAdmission(config(), HostLedger(str(tmp_path / "ledger"), 4 * CHUNK_BYTES))
    assert a.hold("running", 4 * CHUNK_BYTES)
    a.commit("running", 4 * CHUNK_BYTES)
    assert a.end_step() == 0
    assert not a.hold("running", 5 * CHUNK_BYTES) and not a.hold("running", 5 * CHUNK_BYTES)  # asked again: once
    a.release("running")  # preempted
    assert a.end_step() == 1 and a.refusals == 1


def test_a_request_refused_for_wait_s_in_a_row_or_beyond_its_share_is_handed_back_to_end(tmp_path):
    ledger = HostLedger(str(tmp_path / "ledger"), 5 * CHUNK_BYTES)
    a = HostAdmission(config(wait_s=10.0), ledger)
    assert a.hold("holder", 5 * CHUNK_BYTES)
    a.commit("holder", 5 * CHUNK_BYTES)
    assert not a.hold("waits", CHUNK_BYTES) and not a.hold("huge", 11 * CHUNK_BYTES)  # the share is 10 chunks
    a.end_step(now=100.0)
    assert a.take_expired(100.0) == [("huge", "share")]  # no wait admits it: at once
    for now in (105.0, 109.9):
        assert not a.hold("waits", CHUNK_BYTES)
        a.end_step(now=now)
        assert a.take_expired(now) == []  # refused since 100 s: not yet 10 s in a row
    a.end_step(now=110.0)  # a step that did not ask for it: it still waits, but was not refused in this step
    assert a.take_expired(115.0) == []
    assert not a.hold("waits", CHUNK_BYTES)
    a.end_step(now=115.0)
    assert a.take_expired(115.0) == [("waits", "wait")] and a.expired == 2
    # a grant ends the wait: refusals after it count from their own start
    a.release("holder")
    assert a.hold("again", CHUNK_BYTES) is True
    a.end_step(now=200.0)
    a.commit("again", CHUNK_BYTES)
    assert a.hold("hog", 4 * CHUNK_BYTES) and not a.hold("late", CHUNK_BYTES)
    a.end_step(now=300.0)
    assert a.take_expired(305.0) == [] and a.waiting_since == {"late": 300.0}
    a.release("late")
    assert a.waiting_since == {}
    assert a.end_beyond_share("headless") == [("headless", "share")] and a.expired == 3


def test_lent_blocks_taken_back_reserve_their_chunks_at_once_and_count_no_refusal(tmp_path):
    ledger = HostLedger(str(tmp_path / "ledger"), 5 * CHUNK_BYTES)
    a = HostAdmission(config(), ledger)
    assert a.hold("r1", 1 * CHUNK_BYTES)
    a.commit("r1", 1 * CHUNK_BYTES)
    a.end_step()
    assert a.take("r1", 3 * CHUNK_BYTES, blocks=8) and a.total() == 3 * CHUNK_BYTES and a.returned_blocks == 8
    assert a.end_step() == 0 and a.total() == 3 * CHUNK_BYTES  # reserved, not a step's hold: it stays
    assert not a.take("r2", 3 * CHUNK_BYTES, blocks=8)  # the budget has 2 left: r2 keeps its blocks
    assert not a.take("r1", 11 * CHUNK_BYTES, blocks=8)  # beyond its share
    assert a.returned_blocks == 8 and a.refusals == 0 and a.end_step() == 0  # no refusal, nobody held back
    a.release("r1")
    assert a.total() == 0
