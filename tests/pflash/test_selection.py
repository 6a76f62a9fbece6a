"""PFlash selection: forced head/tail, budget, merged spans, lexical anchor rescue, keep curve."""

from __future__ import annotations

import pytest
import torch

from vllm_luce.pflash.selection import SelectionConfig, anchor_chunks, anchor_tier, chunk_scores, merge_spans, select


def _prompt(n: int, seed: int = 0, vocab: int = 1000) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, vocab, (n,), generator=g).tolist()


def test_budget_forced_head_tail_and_top_scores():
    ids = _prompt(32 * 100)
    scores = torch.zeros(len(ids))
    scores[32 * 50: 32 * 51] = 5.0  # chunk 50 scores highest
    scores[32 * 70: 32 * 71] = 4.0
    cfg = SelectionConfig(keep_ratio=0.34, anchors=False)
    sel = select(scores, ids, cfg)
    assert sel.n_chunks == 100 and sel.n_keep == 34 and len(sel.kept_chunks) == 34
    assert sel.forced["head"] == list(range(8)) and sel.forced["tail"] == list(range(76, 100))
    assert 50 in sel.kept_chunks and 70 in sel.kept_chunks
    assert sel.kept_tokens == 34 * 32


def test_forced_chunks_scale_down_when_over_budget():
    ids = _prompt(32 * 200)
    sel = select(torch.rand(len(ids)), ids, SelectionConfig(keep_ratio=0.05, anchors=False))
    assert sel.n_keep == 10 and len(sel.kept_chunks) == 10
    assert len(sel.forced["tail"]) >= 1 and sel.forced["tail"][-1] == 199  # the question survives
    assert len(sel.forced["head"]) + len(sel.forced["tail"]) == 10
    assert len(sel.forced["head"]) < len(sel.forced["tail"])  # 8:24 proportions


def test_spans_are_merged_and_gather_keeps_prompt_order():
    assert merge_spans([0, 1, 2, 5, 7, 8], 32, 32 * 8 + 5) == [(0, 96), (160, 192), (224, 261)]
    ids = list(range(32 * 40 + 7))  # a partial last chunk
    sel = select(torch.rand(len(ids)), ids, SelectionConfig(keep_ratio=0.5, anchors=False))
    kept = sel.gather(ids)
    assert kept == sorted(kept) and len(kept) == sel.kept_tokens and kept[-1] == ids[-1]
    assert all(b > a for a, b in sel.spans) and all(sel.spans[i][1] < sel.spans[i + 1][0]
                                                    for i in range(len(sel.spans) - 1))


def test_planted_needle_rescued_by_anchor_even_with_lowest_score():
    ids = _prompt(32 * 300, seed=1, vocab=50_000)
    needle = [7, 8, 9, 6]  # ids below 10 never occur in the random haystack
    at = 32 * 137 + 5
    ids[at:at + 4] = needle
    ids[-20:-16] = needle  # the question repeats the needle's key
    scores = torch.rand(len(ids)) + 1.0
    scores[32 * 130: 32 * 145] = 0.0  # the drafter scores the needle's neighbourhood lowest
    on = select(scores, ids, SelectionConfig(keep_ratio=0.05))
    radius, _ = anchor_tier(300)
    assert set(range(137 - radius, 138 + radius)) <= set(on.kept_chunks) and 137 in on.forced["anchor"]
    assert needle == on.gather(ids)[on.gather(ids).index(7):][:4]
    off = select(scores, ids, SelectionConfig(keep_ratio=0.05, anchors=False))
    assert 137 not in off.kept_chunks


def test_frequent_ngrams_are_not_anchors():
    ids = _prompt(32 * 300, seed=2)
    common = [1, 2, 3, 4]
    for c in range(0, 280, 10):  # 28 hits: above the tier's max_hits of 8
        ids[32 * c + 3: 32 * c + 7] = common
    ids[-10:-6] = common
    sel = select(torch.rand(len(ids)), ids, SelectionConfig(keep_ratio=0.05))
    assert sel.forced["anchor"] == []


def test_keep_ratio_one_keeps_everything_and_curve_interpolates():
    ids = _prompt(1000)
    sel = select(torch.rand(len(ids)), ids, SelectionConfig(keep_ratio=1.0))
    assert sel.gather(ids) == ids and sel.spans == [(0, 1000)]
    cfg = SelectionConfig(keep_curve=((8192, 0.2), (65536, 0.05), (131072, 0.02)))
    assert cfg.ratio_for(1000) == 0.2 and cfg.ratio_for(200_000) == 0.02
    assert abs(cfg.ratio_for((8192 + 65536) // 2) - 0.125) < 1e-9


def test_chunk_scores_average_partial_last_chunk():
    s = torch.tensor([1.0, 3.0, 5.0, 7.0, 9.0])
    assert chunk_scores(s, 2).tolist() == [2.0, 6.0, 9.0]


def test_anchor_tiers_follow_prompt_length():
    assert anchor_tier(100) == (2, 8) and anchor_tier(1500) == (4, 16) and anchor_tier(4000) == (8, 32)


def _anchor_chunks_reference(ids: torch.Tensor, cfg: SelectionConfig, n_chunks: int) -> list[int]:
    """The definition, one whole-body comparison per query n-gram (what ``anchor_chunks`` computes in one pass)."""
    n, q = cfg.anchor_ngram, cfg.anchor_query_tokens
    body_len = ids.numel() - q
    radius, max_hits = anchor_tier(n_chunks)
    body, query = ids[:body_len].unfold(0, n, 1), ids[body_len:].unfold(0, n, 1)
    seen, out = set(), {}
    for gram in query.flip(0):
        if tuple(gram.tolist()) in seen:
            continue
        seen.add(tuple(gram.tolist()))
        hits = (body == gram).all(dim=1).nonzero().flatten().tolist()
        if 1 <= len(hits) <= max_hits:
            for pos in hits:
                c = pos // cfg.chunk_tokens
                for k in range(max(0, c - radius), min(n_chunks, c + radius + 1)):
                    out.setdefault(k)
    return list(out)


@pytest.mark.parametrize("seed", range(6))
def test_anchor_chunks_match_the_definition_in_order(seed):
    """Random prompts on a small vocabulary (many repeated 4-grams), query n-grams planted 1-40 times."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(3000, 9000, (1,), generator=g))
    ids = torch.randint(0, 12 if seed % 2 else 400, (n,), generator=g)
    cfg = SelectionConfig()
    for _ in range(12):
        start = int(torch.randint(n - 96, n - 4, (1,), generator=g))
        for _ in range(int(torch.randint(1, 40, (1,), generator=g))):
            at = int(torch.randint(0, n - 200, (1,), generator=g))
            ids[at:at + 4] = ids[start:start + 4]
    n_chunks = -(-n // cfg.chunk_tokens)
    assert anchor_chunks(ids, cfg, n_chunks) == _anchor_chunks_reference(ids, cfg, n_chunks)


def test_hash_collisions_are_not_anchors(monkeypatch):
    """A weak key (the n-gram's first token) collides about 10 times per key here: only exact matches count."""
    import vllm_luce.pflash.selection as selection

    ids = _prompt(32 * 300, seed=4)
    ids[32 * 137 + 5: 32 * 137 + 9] = ids[-20:-16]
    monkeypatch.setattr(selection, "gram_keys", lambda x, n: x[:x.numel() - n + 1].long().clone())
    t, cfg = torch.tensor(ids), SelectionConfig()
    got = anchor_chunks(t, cfg, 300)
    assert 137 in got and got == _anchor_chunks_reference(t, cfg, 300)
