"""The PFlash scorer with the block-sparse Triton attention: keeping every block (alpha 0) gives the
dense scores; a real threshold stays close (the trained scorer, 300 tokens, blocks of 32)."""

from __future__ import annotations

import pytest
import torch

from fixtures.trained import trained_model
from vllm_luce.pflash.drafter_spec import DrafterSpec
from vllm_luce.pflash.scorer import DrafterScorer, ScoringConfig

pytestmark = pytest.mark.kernel


def test_sparse_scorer_matches_dense(device):
    spec = DrafterSpec.load(trained_model("scorer"))
    ids = torch.randint(0, spec.vocab_size, (300,), generator=torch.Generator().manual_seed(0))

    def scores(**kw):
        return DrafterScorer(spec, device, torch.float32, ScoringConfig(sparse_block=32, **kw)).token_scores(ids)

    dense = scores(attention="dense")
    torch.testing.assert_close(scores(attention="sparse", sparse_alpha=0.0), dense, rtol=1e-4, atol=1e-6)
    sparse = scores(attention="sparse", sparse_alpha=0.5)
    assert torch.isfinite(sparse).all() and (sparse - dense).abs().max() < 0.1 * dense.abs().max()
