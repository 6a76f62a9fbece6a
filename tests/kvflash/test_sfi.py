"""SFI selection core: the row stays a permutation of the request's chunks with bytes intact, a fast
step's suffix is exactly the sinks + top-k + tail (plus block alignment), attention over that suffix
equals attention over the selected chunks in logical order, and slow steps come every tau tokens."""

import pytest
import torch

from vllm_luce.kvflash.pager import PagerConfig
from vllm_luce.kvflash.pool_store import TensorStore
from vllm_luce.kvflash.policies import QK, Scorer
from vllm_luce.kvflash.sfi import RequestSelection

C = 16  # chunk tokens
CFG = PagerConfig(pool_tokens=8 * C, chunk_tokens=C, sink_chunks=1, recent_chunks=4)  # k = 3


class ChunkStore(TensorStore):
    """Token t of the row holds its logical token id (as written), so moves are checkable."""

    def __init__(self, positions):
        super().__init__(positions, (C, 1), dtype=torch.float64)

    def write_tokens(self, logical_start, count, offsets):
        for t, off in zip(range(logical_start, logical_start + count), offsets):
            self.data[off // C, off % C, 0] = t


def fixed_scores(values):
    return Scorer(lambda sel, chunks: [values.get(c, 0.0) for c in chunks])


def run_prompt(sel, store, n, policy):
    offsets = sel.prepare(0, n, policy)
    store.write_tokens(0, n, offsets)


def decode(sel, store, policy):
    n = sel.num_tokens
    offsets = sel.prepare(n, 1, policy, decoded=1)
    store.write_tokens(n, 1, offsets)
    return sel.skipped_tokens()


def logical_ids(store, sel):
    return [int(store.data[p, 0, 0]) // C for p in range(len(sel.order))]


def test_fast_step_reads_sinks_topk_and_tail_in_a_suffix_with_bytes_intact():
    store = ChunkStore(64)
    sel = RequestSelection(CFG, store)
    policy = fixed_scores({3: 9.0, 7: 8.0, 11: 7.0, 5: 1.0})
    run_prompt(sel, store, 20 * C + 5, policy)  # 21 chunks, the last partial
    skip = decode(sel, store, policy)
    assert sel.selected == [3, 7, 11] and sel.stats.sparse_steps == 1
    assert sorted(sel.order) == list(range(21)) and logical_ids(store, sel) == sel.order  # bytes moved with chunks
    suffix = sel.order[skip // C:]
    assert set(suffix) == {0, 3, 7, 11, 17, 18, 19, 20}
    assert suffix[-4:] == [17, 18, 19, 20]  # the tail is in place, in order, last
    assert sel.resident_tokens() == 20 * C + 6 - skip


def test_attention_over_the_suffix_equals_attention_over_the_selection_in_logical_order():
    torch.manual_seed(0)
    n_tok, d = 20 * C + 3, 8
    keys, values = torch.randn(n_tok, d, dtype=torch.float64), torch.randn(n_tok, d, dtype=torch.float64)
    store = ChunkStore(64)
    sel = RequestSelection(CFG, store)
    policy = fixed_scores({2: 5.0, 9: 4.0, 13: 3.0})
    run_prompt(sel, store, n_tok, policy)
    skip = decode(sel, store, policy)
    row_ids = store.data[:, :, 0].flatten()[: sel.num_tokens].long()  # logical token at each row slot
    q = torch.randn(d, dtype=torch.float64)

    def attend(ids):
        w = torch.softmax(keys[ids] @ q, dim=0)
        return w @ values[ids]

    read = row_ids[skip:]
    read = read[read < n_tok]  # the prompt part (the decoded token's id is n_tok)
    chunks = [0] + sel.selected + list(range(sel.tail_start, sel.num_chunks))
    logical = torch.tensor([t for c in chunks for t in range(c * C, min((c + 1) * C, n_tok))])
    assert torch.allclose(attend(read), attend(logical))
    full = row_ids[row_ids < n_tok]
    assert torch.allclose(attend(full), attend(torch.arange(n_tok)))  # a dense step over the permuted row


def test_suffix_starts_on_a_block_boundary_and_covers_the_selection():
    store = ChunkStore(64)
    sel = RequestSelection(CFG, store, align_tokens=3 * C)
    policy = fixed_scores({4: 3.0, 6: 2.0, 8: 1.0})
    run_prompt(sel, store, 22 * C, policy)
    skip = decode(sel, store, policy)
    assert skip % (3 * C) == 0 and 0 < skip <= sel.window * C
    assert {0, 4, 6, 8} <= set(sel.order[skip // C:])


def test_slow_steps_come_every_tau_and_their_queries_choose_the_next_selection():
    store = ChunkStore(128)
    cfg = PagerConfig(pool_tokens=8 * C, chunk_tokens=C, tau_min=4)
    sel = RequestSelection(cfg, store)
    scores = {5: 1.0}
    policy = Scorer(lambda s, chunks: [scores.get(c, 0.0) for c in chunks])
    run_prompt(sel, store, 40 * C, policy)  # tau = max(4, 640 // 45) = 14
    skips = [decode(sel, store, policy) for _ in range(30)]
    dense = [i for i, s in enumerate(skips) if s == 0]
    assert dense == [13, 27] and sel.stats.dense_steps == 2 and sel.stats.sparse_steps == 28
    assert sel.stats.reselections == 3  # the first decode step, then after each slow step
    assert 5 in sel.selected


def test_a_context_within_the_budget_is_always_dense_and_never_moves():
    store = ChunkStore(16)
    sel = RequestSelection(CFG, store)
    run_prompt(sel, store, 7 * C, fixed_scores({2: 1.0}))
    assert all(decode(sel, store, fixed_scores({2: 1.0})) == 0 for _ in range(C))
    assert sel.stats.moves == 0 and sel.order == list(range(8)) and sel.stats.sparse_steps == 0


def test_rejected_drafts_rewrite_the_tail_but_not_moved_chunks():
    store = ChunkStore(64)
    sel = RequestSelection(CFG, store)
    policy = fixed_scores({3: 9.0, 7: 8.0, 11: 7.0})
    run_prompt(sel, store, 20 * C, policy)
    decode(sel, store, policy)
    n = sel.num_tokens
    sel.prepare(n - 3, 4, policy, decoded=4)  # 3 draft tokens rejected, 4 new
    assert sel.num_tokens == n + 1 and sel.order[-1] == sel.num_chunks - 1
    moved = next(p for p, c in enumerate(sel.order) if c != p)
    with pytest.raises(RuntimeError, match="was moved"):
        sel.prepare(moved * C, 1, policy)


def test_qk_policy_selects_the_chunk_whose_keys_match_the_query():
    torch.manual_seed(1)
    store = TensorStore(64, (C, 2, 4), dtype=torch.float32)  # [positions, tokens, kv_heads, head]
    store.data.normal_()
    target = torch.tensor([1.0, 0, 0, 0])
    store.data[9] = target + 0.01 * torch.randn(C, 2, 4)  # chunk 9's keys point along the query
    store.summarize = lambda p: store.data[p].mean(0)[None]  # [layers=1, kv_heads, head]
    sel = RequestSelection(PagerConfig(pool_tokens=6 * C, chunk_tokens=C), store)
    policy = QK()
    sel.prepare(0, 20 * C, policy)
    sel.queries = target.repeat(1, 4, 1)  # [layers, q_heads, head]
    sel.prepare(20 * C, 1, policy, decoded=1)
    assert sel.selected == [9]


def test_release_frees_everything():
    store = ChunkStore(64)
    sel = RequestSelection(CFG, store)
    run_prompt(sel, store, 20 * C, fixed_scores({}))
    decode(sel, store, fixed_scores({}))
    assert sel.release() == 0 and not sel.order and not sel.summaries and sel.resident_tokens() == 0


def test_summaries_are_taken_only_from_chunks_written_by_earlier_steps():
    """The step's own tokens reach the cache during its forward, after ``prepare``: summarising them
    then would cache a blank chunk forever (a bug caught by the needle diagnostic)."""
    store = TensorStore(64, (C, 1, 2), dtype=torch.float32)
    store.summarize = lambda p: store.data[p].mean(0)[None]
    sel = RequestSelection(CFG, store)
    sel.prepare(0, 3 * C, QK())
    assert not sel.summaries  # nothing was written before this step
    store.data[:3] = 1.0  # the forward writes the step's KV
    sel.prepare(3 * C, 1, QK(), decoded=1)
    assert sorted(sel.summaries) == [0, 1, 2] and all(bool((v == 1).all()) for v in sel.summaries.values())


def test_attention_policy_finds_the_one_key_a_query_points_at_where_mean_keys_do_not():
    """One token of chunk 7 matches the query; its chunk mean is noise like the others."""
    from vllm_luce.kvflash.policies import MaxLogit, max_logit_layer_scores

    torch.manual_seed(2)
    store = TensorStore(64, (C, 2, 8), dtype=torch.float32)  # [positions, tokens, kv_heads, head]
    store.data.normal_()
    query = torch.zeros(8)
    query[0] = 4.0
    store.data[7, 5, 1] = query  # one key of KV head 1, chunk 7
    store.keys_at = lambda ps: store.data[ps][:, None]  # [C, layers=1, tokens, kv_heads, head]
    sel = RequestSelection(PagerConfig(pool_tokens=6 * C, chunk_tokens=C), store)
    policy = MaxLogit()
    sel.prepare(0, 20 * C, policy)
    sel.queries = torch.stack([torch.randn(8), torch.randn(8), query, torch.randn(8)])[None]  # head 2 -> KV head 1
    sel.prepare(20 * C, 1, policy, decoded=1)
    assert sel.selected == [7]
    q, k = torch.randn(3, 4, 8), torch.randn(5, 3, C, 2, 8)
    brute = torch.tensor([[max(float(k[c, l, t, h // 2] @ q[l, h]) for t in range(C) for h in range(4)) / 8 ** 0.5
                           for l in range(3)] for c in range(5)])
    assert torch.allclose(max_logit_layer_scores(q, k), brute, atol=1e-5)
