"""KVFlash's drafter-scorer policy: chunk scores from token scores, refreshed as the context grows."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vllm_luce.scorer_policy import DrafterChunkScorer


def test_chunk_means_cache_and_refresh():
    tokens = list(range(1000))
    calls = []

    def token_scores(ids):
        calls.append(len(ids))
        return torch.tensor([float(i % 7) for i in ids])

    scorer = DrafterChunkScorer(token_scores, lambda req_id: (tokens, 300), chunk_tokens=64, refresh_tokens=256)
    pager = SimpleNamespace(req_id="a", num_tokens=100)  # prefill: the whole 300-token prompt is scored
    got = scorer(pager, [0, 3, 4, 9])
    expected = [sum(i % 7 for i in range(c * 64, c * 64 + 64)) / 64 for c in (0, 3)]
    assert got[:2].tolist() == expected and got[2:].tolist() == [float("inf")] * 2  # chunk 4 is partial
    pager.num_tokens = 500
    scorer(pager, [0])
    assert calls == [300]  # grew by 200 < 256: cached
    pager.num_tokens = 600
    scorer(pager, [0])
    assert calls == [300, 600] and scorer.passes == 2
    scorer.release("a")
    assert "a" not in scorer.cache


def test_chunks_holding_the_question_s_ngrams_outrank_attention():
    """The 4-gram 900..903 ends the context and also sits in chunk 2 (and 901..904 in chunk 5): both
    chunks outrank attention, the latest match first; chunk 7, highest by attention, comes next."""
    tokens = list(range(1000, 1800))
    tokens[140:144] = [900, 901, 902, 903]
    tokens[330:335] = [900, 901, 902, 903, 904]
    tokens[-5:] = [900, 901, 902, 903, 904]

    def token_scores(ids):
        return torch.tensor([1.0 if 7 * 64 <= i < 8 * 64 else 0.0 for i in range(len(ids))])

    scorer = DrafterChunkScorer(token_scores, lambda req_id: (tokens, 800), chunk_tokens=64, refresh_tokens=256)
    got = scorer(SimpleNamespace(req_id="a", num_tokens=800), list(range(12)))
    order = torch.argsort(got[:12], descending=True, stable=True).tolist()
    assert order[:3] == [5, 2, 7] and got[0] == 0.0
