"""Adaptive verify width and the non-finite guard for DFlash drafts (pure torch, no vLLM).

A DFlash block drafts K tokens at once; slot k's top-1 probability is the drafter's confidence
in it. The chance that the target accepts the first k drafts is at most the product of those
confidences, so verifying past the point where that product falls below a threshold mostly
buys rejected tokens. ``verify_widths`` keeps, per request, the longest draft prefix whose
cumulative confidence stays at or above ``threshold``, but at least ``minimum`` drafts.

A slot whose logits are not all finite has confidence 0 and ends the prefix before it, whatever
the minimum: such a draft is never verified, so it cannot change output. ``sanitize_logits``
makes those rows harmless for argmax and sampling.
"""

from __future__ import annotations

import torch


def draft_confidence(logits: torch.Tensor) -> torch.Tensor:
    """Top-1 softmax probability per row of ``logits`` [rows, vocab]; 0 where a row is not finite."""
    finite = torch.isfinite(logits).all(dim=-1)
    safe = torch.where(finite[:, None], logits.float(), torch.zeros((), device=logits.device))
    top1 = torch.softmax(safe, dim=-1).amax(dim=-1)
    return torch.where(finite, top1, torch.zeros_like(top1))


def sanitize_logits(logits: torch.Tensor) -> torch.Tensor:
    """Non-finite values replaced by the dtype's lowest finite value (rows stay samplable). One elementwise
    kernel and no host sync: Model Runner V2 captures the drafter's sampling in a CUDA graph, where a
    ``bool(tensor)`` check stopped capture."""
    low = torch.finfo(logits.dtype).min
    return torch.nan_to_num(logits, nan=low, posinf=low, neginf=low)


def verify_widths(confidence: torch.Tensor, threshold: float, minimum: int) -> torch.Tensor:
    """Drafts to verify per request. ``confidence`` [requests, K] (request-major rows)."""
    if confidence.dim() != 2:
        raise ValueError(f"confidence must be [requests, K], got shape {tuple(confidence.shape)}")
    k = confidence.shape[1]
    survival = torch.cumprod(confidence.float(), dim=1)
    by_confidence = (survival >= threshold).int().cumprod(dim=1).sum(dim=1)
    finite_prefix = (confidence > 0).int().cumprod(dim=1).sum(dim=1)
    return torch.minimum(torch.clamp(by_confidence, min=min(minimum, k)), finite_prefix)
