"""KVFlash decides at positions fixed by the request alone (``decisions.py``): the schedule, the scheduler's cut, and
the property it buys: whatever the steps (a request alone, steps shared under load, verify steps with rejected
drafts, a restart after preemption), every token attends to the same chunks, chosen with the same queries."""

import random

import pytest
import torch

from vllm_luce.kvflash.decisions import Decisions
from vllm_luce.kvflash.pager import PagerConfig, RequestPager
from vllm_luce.kvflash.pool_store import TensorStore
from vllm_luce.kvflash.policies import QK
from vllm_luce.kvflash.query_window import push_queries

C = 4  # chunk tokens
CFG = PagerConfig(pool_tokens=8 * C, chunk_tokens=C, tau_min=4)  # epochs of 2 chunks
SHAPE = (2, C, 3, 8)  # [layers, tokens, KV heads, head dim]: QK reads the mean key of each layer and head
WINDOW, MAX_DRAFTS = 3, 4


def plan(prompt: int) -> Decisions:
    return Decisions(C, CFG.pool_tokens, CFG.epoch_tokens, CFG.tau_min, prompt)


def test_a_paged_prompt_decides_at_its_epochs_and_its_last_token_then_at_chunks_and_reselections():
    d = plan(50)  # beyond the 32-token pool
    assert CFG.epoch_tokens == 2 * C and d.prompt_end == 49
    assert [p for p in range(60) if d.is_decision(p)] == [0, 8, 16, 24, 32, 40, 48, 49, 52, 56]
    assert [p for p in range(49, 60) if d.reselects_at(p)] == [49, 52, 56]  # the interval is 4 here


def test_a_prompt_within_the_pool_decides_nothing_before_it_decodes():
    d = plan(20)
    assert d.prompt_end is None and [p for p in range(30) if d.is_decision(p)] == [0, 20, 24, 28]
    assert d.cut(0, 20) == 20 and d.cut(20, 5) == 5  # steps within the pool are never cut
    assert d.cut(30, 5) == 2  # this one would end beyond it: cut at the chunk boundary 32


def test_reselections_grow_apart_with_the_context_in_powers_of_two():
    d = Decisions(64, 4096, 3840, 16, 100)
    assert d.interval(4096) == 64 and d.interval(45 * 1000) == 512 and d.interval(100) == 16
    found = [p for p in range(101, 200_000) if d.reselects_at(p)]
    assert all(d.next_reselection(a) == b for a, b in zip(found, found[1:]))
    gaps = [b - a for a, b in zip(found, found[1:])]
    assert gaps == sorted(gaps) and all(b <= a / 45 or b == 16 for a, b in zip(found[1:], gaps))


def test_the_cut_ends_each_step_at_the_next_decision():
    d = plan(50)
    assert d.cut(0, 20) == 20  # within the pool: nothing to decide yet
    assert d.cut(24, 20) == 8 and d.cut(41, 20) == 7 and d.cut(48, 2) == 1 and d.cut(49, 1) == 1
    assert d.cut(50, 5) == 2  # a verify step of 1 + 4 tokens: up to the chunk boundary 52


def test_a_step_whose_start_is_known_only_up_to_the_drafts_in_flight_never_runs_across_a_decision():
    """Asynchronous scheduling counts the drafts of the step in flight as accepted: the scheduler sees a start up to
    ``behind`` tokens after the step's real one. Cut with ``behind``, no real step runs across a decision position;
    cut without it, some do."""
    rng, spans_without = random.Random(0), 0
    for _ in range(4000):
        d = plan(rng.randrange(10, 80))
        real, behind = rng.randrange(d.prompt_tokens, 200), rng.randrange(0, MAX_DRAFTS + 2)
        seen, want = real + rng.randrange(0, behind + 1), rng.randrange(1, MAX_DRAFTS + 2)  # as the scheduler sees
        n = d.cut(seen, want, behind=behind)
        assert n >= 1 and not spans(d, real, n), (real, seen, behind, n)
        spans_without += spans(d, real, d.cut(seen, want))
    assert spans_without > 100


def spans(d: Decisions, start: int, n: int) -> bool:
    """Whether a step of ``n`` tokens from ``start`` that ends beyond the pool runs across a decision position."""
    return start + n > d.pool_tokens and any(d.is_decision(p) for p in range(start + 1, start + n))


def value(position: int, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(position * 7 + salt)
    return torch.randn(SHAPE[0], *SHAPE[2:], generator=g)  # one token's keys, a function of its position


def decode(prompt: int, outputs: int, rng: random.Random | None, cut: bool = True, restart_at: int | None = None):
    """One request through the real pager and QK policy, as the worker runs it: per position, the chunks its token
    attends to (resident, up to its own chunk). ``rng`` None: alone (prefill epochs, one token a step); else random
    step budgets, verify steps of random drafts with random rejections, and the rejected tokens' queries handed
    over too (they are garbage). ``restart_at``: preempted there, then recomputed from position 0."""
    total, seen, policy = prompt + outputs, {}, QK()
    d = plan(prompt)

    def new_pager():
        p = RequestPager(CFG, TensorStore(CFG.pool_chunks + 3, SHAPE))
        p.prompt_tokens = prompt
        return p

    pager, pos, restarted = new_pager(), 0, False
    while pos < total:
        if restart_at is not None and not restarted and pos >= restart_at:
            pager, pos, restarted = new_pager(), 0, True
        recompute = pos < max(prompt, restart_at or 0) if restarted else pos < prompt
        if rng is None:
            n = CFG.max_step_tokens if recompute else 1
        else:
            n = rng.randint(1, CFG.max_step_tokens) if recompute else 1 + rng.randint(0, MAX_DRAFTS)
        n = min(n, total - pos)
        if cut:
            n = d.cut(pos, n)
        decoded = max(0, pos + n - max(pos, prompt))
        offsets = pager.prepare(pos, n, policy, decoded=decoded, prompt_end=n == 1 and pos + 1 == prompt)
        for q, off in zip(range(pos, pos + n), offsets):
            pager.store.data[off // C][:, off % C] = value(q)
        accepted = n if recompute or rng is None else rng.randint(1, n)
        for q in range(pos, pos + accepted):
            seen[q] = tuple(c for c in pager.resident if c <= q // C)
        # the queries of every token the step ran, rejected drafts' garbage included, as the runtime hands them over
        queries = torch.stack([value(q, salt=0 if q < pos + accepted else 1000) for q in range(pos, pos + n)])
        push_queries(pager, queries.unsqueeze(2).expand(-1, -1, 2, -1, -1).flatten(2, 3), WINDOW,
                     WINDOW + MAX_DRAFTS)
        pos += accepted
    return seen, pager


@pytest.mark.parametrize("prompt", [50, 77, 20])
def test_every_token_attends_to_the_same_chunks_however_its_steps_are_cut(prompt):
    alone, pager = decode(prompt, 120, None)
    assert pager.stats.page_outs > 10 and pager.stats.reselections > 5 and pager.stats.page_ins > 0
    for seed in range(6):
        rng = random.Random(seed)
        loaded, pager = decode(prompt, 120, rng, restart_at=rng.randint(prompt // 2, prompt + 100) if seed % 2 else None)
        assert loaded == alone, (seed, [q for q in alone if loaded[q] != alone[q]][:5])
        assert pager.stats.uncut_decisions == 0


def test_without_the_cut_tokens_follow_the_steps():
    """The check above can fail: the same loads, steps not cut at the decision positions."""
    alone, _ = decode(50, 120, None)
    differs = 0
    for seed in range(6):
        loaded, pager = decode(50, 120, random.Random(seed), cut=False)
        differs += loaded != alone
        assert pager.stats.uncut_decisions > 0
    assert differs >= 4


def test_a_step_cut_short_of_its_epoch_is_reserved_host_memory_for_the_whole_epoch():
    """At an epoch's start the pager pages out room for the whole epoch, whatever the step's length: the scheduler
    reserves host memory for ``room_until``, and a reservation for the step's own tokens would fall short."""
    from vllm_luce.kvflash.admission import AdmissionConfig

    tiers = AdmissionConfig(chunk_tokens=C, pool_chunks=CFG.pool_chunks, block_size=C, chunk_bytes=1,
                            request_bytes=10**6)
    pager, policy, d = RequestPager(CFG, TensorStore(CFG.pool_chunks, SHAPE)), QK(), plan(200)
    pager.prompt_tokens = 200
    pos = 0
    while pos < 48:  # steps of one epoch (8 tokens): 12 chunks through a pool of 8
        pager.prepare(pos, d.cut(pos, 8), policy)
        pos = pager.num_tokens
    assert d.is_decision(48) and d.room_until(48, 50) == 56
    pager.prepare(48, 2, policy)  # a step of 2 tokens, cut short by the load: room made for 8
    rows = CFG.pool_chunks  # the pool's row: no cold positions
    assert pager.check_host_reservation(tiers.host_chunks(d.room_until(48, 50), rows)) == 0
    assert len(pager.host) > tiers.host_chunks(50, rows)  # what the step's own tokens would have reserved
