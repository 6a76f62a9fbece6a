"""Patch: a plain step (K = 0) of V1's DFlash proposer writes the drafter's context and runs no drafter (see LEDGER).

vLLM's own path for K = 0 runs the drafter's forward on one query per request and then returns nothing.
Only the context pass matters for later drafts: the step's target features through ``fc`` and
``hidden_norm`` into each drafter layer's K/V. A plain step here runs that pass alone, on every scheduled
token's features, positions and drafter cache slots (what vLLM's path writes), and returns no drafts.
Model Runner V2's plain steps: ``spec_decode/plain_steps_v2.py``.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.hook_ledger import ledger_signature
from vllm_luce.patches import wrap_method

TARGET = "vllm.v1.spec_decode.dflash:DFlashProposer.propose"


def write_context(proposer, target_positions, target_hidden_states, cad) -> None:
    """The drafter's context pass for the step's ``cad.num_actual_tokens`` tokens. ``target_hidden_states`` is
    one tensor, or the target layers' outputs (concatenated). The drafter's layers share the metadata's KV cache
    group, so a token's drafter slot is its slot in the step's slot mapping."""
    n = cad.num_actual_tokens
    positions = (target_positions[0] if target_positions.dim() == 2 else target_positions)[:n]
    if isinstance(target_hidden_states, (list, tuple)):
        target_hidden_states = torch.cat([h[:n] for h in target_hidden_states], dim=-1)
    model = proposer.model
    with torch.inference_mode():  # as vLLM's proposer: the pass writes the drafter's cache
        model.precompute_and_store_context_kv(model.combine_hidden_states(target_hidden_states[:n]), positions,
                                              cad.slot_mapping[:n].long())


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
        write_context(self, target_positions, target_hidden_states, common_attn_metadata)
        return torch.empty(common_attn_metadata.batch_size(), 0, device=target_positions.device, dtype=torch.int64)

    return propose


def apply() -> bool:
    from vllm.v1.spec_decode.dflash import DFlashProposer

    return wrap_method(DFlashProposer, "propose", ledger_signature(TARGET), _make_wrapper, inherited=True)
