"""vLLM's DFlash drafter (``DFlashQwen3ForCausalLM``) with the non-finite guard and the draft
confidences the adaptive verify width needs; registered for ``DFlashDraftModel`` checkpoints.

Only ``compute_logits`` changes. It runs once per step on all ``batch x K`` draft slots, in both
model runners. It records which rows were finite and, when ``luce.dflash.verify_confidence`` is
set, each row's top-1 probability. It then returns logits with non-finite values replaced, so
argmax and sampling never see NaN. The runner binding (``runner.py``) drops unverifiable drafts.
"""

from __future__ import annotations

import torch
from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

from vllm_luce.config import LuceConfig
from vllm_luce.spec_decode.verify_width import draft_confidence, sanitize_logits


class LuceDFlashQwen3ForCausalLM(DFlashQwen3ForCausalLM):
    def __init__(self, *, vllm_config, prefix: str = "", **kwargs):
        super().__init__(vllm_config=vllm_config, prefix=prefix, **kwargs)
        dflash = LuceConfig.from_vllm_config(vllm_config).dflash
        self.luce_verify_confidence = float(dflash.verify_confidence) if dflash.on_when_used() else 0.0
        self.luce_min_verify_tokens = int(dflash.min_verify_tokens)
        # Per row of the last compute_logits: confidence in [0, 1] (0 = not finite), or None.
        self.luce_confidence: torch.Tensor | None = None

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.luce_record(super().compute_logits(hidden_states))

    def luce_record(self, logits: torch.Tensor | None) -> torch.Tensor | None:
        """Record this step's per-slot confidence (or finiteness) and return safe logits."""
        if logits is None:
            self.luce_confidence = None
            return None
        if self.luce_verify_confidence > 0:
            self.luce_confidence = draft_confidence(logits)
        else:
            self.luce_confidence = torch.isfinite(logits).all(dim=-1).float()
        return sanitize_logits(logits)
