"""Adaptive verify width and the non-finite guard (pure)."""

import math

import pytest
import torch

from vllm_luce.spec_decode.verify_width import draft_confidence, sanitize_logits, verify_widths


def test_confidence_is_top1_probability_and_zero_when_not_finite():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0], [1.0, float("nan"), 0.0, 0.0],
                           [float("inf"), 0.0, 0.0, 0.0]])
    conf = draft_confidence(logits)
    assert conf[0].item() == pytest.approx(0.25)
    assert conf[1].item() == pytest.approx(math.exp(10) / (math.exp(10) + 3))
    assert conf[2].item() == 0.0 and conf[3].item() == 0.0
    assert torch.isfinite(conf).all()


def test_width_is_the_prefix_above_the_threshold_with_a_minimum():
    conf = torch.tensor([[0.9, 0.9, 0.9, 0.9],    # survival .9 .81 .729 .656
                         [0.5, 0.99, 0.99, 0.99],  # .5 ...
                         [0.99, 0.99, 0.99, 0.99]])
    assert verify_widths(conf, 0.7, 1).tolist() == [3, 1, 4]
    assert verify_widths(conf, 0.7, 2).tolist() == [3, 2, 4]
    assert verify_widths(conf, 0.0, 1).tolist() == [4, 4, 4]  # threshold 0: verify everything
    assert verify_widths(conf, 0.999, 9).tolist() == [4, 4, 4]  # minimum capped at K


def test_non_finite_slot_ends_the_prefix_despite_the_minimum():
    conf = torch.tensor([[0.99, 0.0, 0.99, 0.99], [0.0, 0.99, 0.99, 0.99]])
    assert verify_widths(conf, 0.0, 4).tolist() == [1, 0]


def test_sanitized_logits_are_finite_and_keep_finite_values():
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        logits = torch.randn(7, 33, generator=g).to(dtype)
        logits[2, 5], logits[4, :] = float("nan"), float("-inf")
        logits[6, 1] = float("inf")
        clean = sanitize_logits(logits)
        assert torch.isfinite(clean).all()
        mask = torch.isfinite(logits)
        assert torch.equal(clean[mask], logits[mask])
        torch.softmax(clean.float(), dim=-1).multinomial(1)  # samplable


def test_shape_is_checked():
    with pytest.raises(ValueError, match=r"\[requests, K\]"):
        verify_widths(torch.ones(4), 0.5, 1)


def test_sanitize_logits_never_syncs_with_the_host():
    """Model Runner V2 captures drafting in a CUDA graph: a data-dependent branch (a host sync) would stop capture.
    fullgraph tracing fails on such a branch, as capture does."""
    import torch._dynamo

    torch._dynamo.reset()
    traced = torch.compile(sanitize_logits, backend="eager", fullgraph=True)
    logits = torch.tensor([[0.5, float("nan")], [float("inf"), -float("inf")]], dtype=torch.bfloat16)
    low = torch.finfo(torch.bfloat16).min
    assert torch.equal(traced(logits), torch.tensor([[0.5, low], [low, low]], dtype=torch.bfloat16))
