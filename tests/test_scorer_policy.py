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


def test_the_seam_attaches_the_drafter_after_both_features_and_kvflash_imports_none_of_it():
    """The seam's hook row runs after KVFlash's bindings and PFlash's (the initialize_kv_cache patch runs a runner's
    rows, then the rows of both runners, in table order); until it has run, the scorer policy says what is missing;
    off rank 0 (no drafter there) it stops startup naming the setting."""
    import pytest

    from vllm_luce import hooks, scorer_policy
    from vllm_luce.kvflash.policies import make_policy

    both = [h.owners[0] for h in hooks.features(hooks.KV_CACHE_BOTH)]
    assert both.index("vllm_luce.scorer_policy:bind") > both.index("vllm_luce.pflash.worker:bind")
    assert all(h.stage != hooks.KV_CACHE_BOTH for h in hooks.features() if h.owners[0].startswith("vllm_luce.kvflash"))
    policy = make_policy("scorer")
    with pytest.raises(RuntimeError, match="no chunk scorer attached"):
        policy.scores(None, [0])
    config = SimpleNamespace(chunk_tokens=64, pool_tokens=1024)
    runtime = SimpleNamespace(policy=policy, config=config, tokens_of=lambda req_id: ([1] * 128, 128))
    with pytest.raises(RuntimeError, match="luce.kvflash.policy 'scorer' with tensor/pipeline parallelism"):
        scorer_policy.bind(SimpleNamespace(luce_kvflash=runtime, luce_pflash=None), None)
    scores = SimpleNamespace(token_scores=lambda ids: torch.arange(len(ids), dtype=torch.float))
    service = SimpleNamespace(scorer=scores)
    scorer_policy.bind(SimpleNamespace(luce_kvflash=runtime, luce_pflash=service), None)
    assert policy.scores(SimpleNamespace(req_id="r", num_tokens=128), [0, 1]).tolist()[1] > 0
    untouched = make_policy("qk")
    scorer_policy.bind(SimpleNamespace(luce_kvflash=SimpleNamespace(policy=untouched), luce_pflash=None), None)
