"""Patch: a plain step (K = 0) of V1's DFlash proposer runs only the drafter's context pass (see LEDGER).

vLLM's own path for K = 0 runs the whole drafter forward on one bonus token per request and then
returns nothing. Here the context pass alone runs: the newly committed tokens' target features
through ``fc`` and ``hidden_norm`` into each layer's K/V in the drafter's cache. That is the part
later drafts need. The query block, the MLPs and the lm_head are skipped.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.patches import ledger_signature, wrap_method

TARGET = "vllm.v1.spec_decode.dflash:DFlashProposer.propose"


def _make_wrapper(original):
    @functools.wraps(original)
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
        if num_speculative_tokens != 0:
            return original(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                            next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                            mm_embed_inputs, num_rejected_tokens_gpu, slot_mappings)
        self.num_speculative_tokens = 0
        self._last_draft_probs = None
        batch_size = common_attn_metadata.batch_size()
        context = self.model.combine_hidden_states(target_hidden_states)
        num_tokens, _, _ = self.set_inputs_first_pass(
            target_token_ids=target_token_ids, next_token_ids=next_token_ids, target_positions=target_positions,
            target_hidden_states=context, token_indices_to_sample=token_indices_to_sample,
            cad=common_attn_metadata, num_rejected_tokens_gpu=num_rejected_tokens_gpu)
        self.build_model_inputs_first_pass(num_tokens, num_tokens, None)  # writes the context K/V
        return torch.empty(batch_size, 0, device=next_token_ids.device, dtype=torch.int64)

    return propose


def apply() -> bool:
    from vllm.v1.spec_decode.dflash import DFlashProposer

    return wrap_method(DFlashProposer, "propose", ledger_signature(TARGET), _make_wrapper, inherited=True)
