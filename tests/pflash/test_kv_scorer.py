"""KVFlash's drafter-scorer policy: chunk scores from token scores, refreshed as the context grows."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vllm_luce.pflash.kv_scorer import DrafterChunkScorer


def test_chunk_means_cache_and_refresh():
    tokens = list(range(1000))
    calls = []

    def token_scores(ids):
        calls.append(len(ids))
        return torch.tensor([float(i % 7) for i in ids])

    scorer = DrafterChunkScorer(token_scores, lambda req_id: tokens, chunk_tokens=64, refresh_tokens=256)
    pager = SimpleNamespace(req_id="a", num_tokens=300)
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
