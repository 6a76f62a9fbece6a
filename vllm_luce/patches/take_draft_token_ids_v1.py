"""Patch: adaptive verify width and the non-finite guard on the drafts V1's model runner hands to
the scheduler (see LEDGER). The widths come from ``spec_decode.verify_width``; the confidences
from the Luce DFlash drafter class (``spec_decode.drafter``)."""

from __future__ import annotations

import functools

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method
from vllm_luce.spec_decode.verify_width import verify_widths

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.take_draft_token_ids"


def drafter_model(runner):
    model = getattr(getattr(runner, "drafter", None), "model", None)
    unwrap = getattr(model, "unwrap", None)
    return unwrap() if callable(unwrap) else model


def truncate_drafts(draft_lists: list[list[int]], model) -> bool:
    """Cut each request's drafts to its verify width, in place; False when the recorded
    confidences do not belong to these drafts (a step that drafted nothing)."""
    confidence = getattr(model, "luce_confidence", None)
    if confidence is None or not draft_lists:
        return False
    model.luce_confidence = None  # one step's confidences are used once
    k = len(draft_lists[0])
    if k == 0 or confidence.numel() != len(draft_lists) * k or any(len(d) != k for d in draft_lists):
        return False
    widths = verify_widths(confidence.view(len(draft_lists), k).cpu(), model.luce_verify_confidence,
                           model.luce_min_verify_tokens)
    for drafts, width in zip(draft_lists, widths.tolist()):
        del drafts[width:]
    return True


def _make_wrapper(original):
    @functools.wraps(original)
    def take_draft_token_ids(self):
        drafts = original(self)
        model = drafter_model(self)
        if drafts is not None and hasattr(model, "luce_confidence"):
            truncate_drafts(drafts.draft_token_ids, model)
        return drafts

    return take_draft_token_ids


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "take_draft_token_ids", ledger_signature(TARGET), _make_wrapper)
