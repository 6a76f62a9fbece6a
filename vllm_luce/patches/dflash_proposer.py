"""Patch: a plain step (K = 0) of V1's DFlash proposer runs no drafter at all (see LEDGER).

vLLM's own path for K = 0 runs the whole drafter forward on one bonus token per request and then
returns nothing. Only the context pass matters for later drafts: the newly committed tokens' target
features through ``fc`` and ``hidden_norm`` into each layer's K/V in the drafter's cache. Here a plain
step only keeps those features, positions and slots (``DeferredContext``); the next drafting step,
or a full store, writes them all in one context pass before its own work.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.patches import ledger_signature, wrap_method
from vllm_luce.spec_decode.deferred_context import DeferredContext, DeferredContextByReference, pad_rows

TARGET = "vllm.v1.spec_decode.dflash:DFlashProposer.propose"


# A step with this many tokens writes its context at once (after what is held). Holding pays where a
# pass costs about the same for few tokens as for many (weight reads and launches); at many tokens a
# step's pass is already efficient and holding adds copies and a take. Measured on an H100 with a
# Qwen3-8B-DFlash shape (benchmarks/dflash_plain_step_gpu.py, three runs): holding cost 0.5-1.0x the
# per-step pass up to 64 tokens, 1.1-1.3x at 128, 1.6-1.9x at 256. For the copying store only: the store by
# reference copies nothing when it holds, so it holds every step.
DIRECT_WRITE_TOKENS = 128

# Rows the store by reference holds at most, in step token budgets: its full-store pass then costs at most
# that many steps' worth of context rows (a latency spike bounded like a few prefill chunks'), and a batch
# of 64 short requests (prompt and 192 tokens each, the CPU throughput benchmark) fits in one.
HELD_STEP_BUDGETS = 8


def deferred(proposer, by_reference: bool = False) -> DeferredContext:
    """The proposer's store, made on first use: ``by_reference`` where each step's features are new tensors
    that nothing writes after the step (``DeferredContextByReference``), otherwise copied into buffers."""
    held = getattr(proposer, "_luce_deferred", None)
    if held is None:
        held = proposer._luce_deferred = (DeferredContextByReference(HELD_STEP_BUDGETS * proposer.max_num_tokens)
                                          if by_reference else DeferredContext(proposer.max_num_tokens))
    return held


def write_context(proposer, features, positions, slots) -> None:
    """The drafter's context pass: target features (one tensor, or the target layers' outputs to
    concatenate) through fc and hidden_norm into each layer's K/V."""
    if isinstance(features, (list, tuple)):
        features = torch.cat(features, dim=-1)
    if features.device.type == "cpu":  # row counts that repeat: oneDNN builds a GEMM kernel per new one
        features, positions, slots = pad_rows(features, positions, slots)
    proposer.model.precompute_and_store_context_kv(proposer.model.combine_hidden_states(features), positions,
                                                   slots.long())


def write_deferred(proposer, cad) -> None:
    """The held context writes of live requests (blocks in this step's drafter block table), in one
    pass, into the drafter's cache."""
    batch = deferred(proposer).take(cad.block_table_tensor[: cad.num_reqs], proposer.block_size)
    if batch is not None:
        write_context(proposer, *batch)


def first_rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """``t[:n]``, without the slice's per-call cost when ``t`` has ``n`` rows (an unpadded batch)."""
    return t if t.shape[0] == n else t[:n]


def hold_context(proposer, target_positions, target_hidden_states, cad) -> None:
    """Keep a plain step's context writes. A large step (``DIRECT_WRITE_TOKENS``, where the store copies), or one
    that would not fit after the store's ``make_room``, writes what is held, then holds or writes its own.
    ``target_hidden_states`` is one tensor, or the target layers' outputs (concatenated when held)."""
    n = cad.num_actual_tokens
    positions = first_rows(target_positions[0] if target_positions.dim() == 2 else target_positions, n)
    features = ([first_rows(h, n) for h in target_hidden_states]
                if isinstance(target_hidden_states, (list, tuple)) else first_rows(target_hidden_states, n))
    # The drafter's layers share this metadata's KV cache group: a context token's drafter slot is its
    # slot in the target's slot mapping (vLLM's DFlash input kernel computes the same from the block table).
    slots = first_rows(cad.slot_mapping, n)
    held = deferred(proposer)
    holdable = n < DIRECT_WRITE_TOKENS or held.holds_large_steps
    if holdable and held.hold(features, positions, slots):
        return
    with torch.inference_mode():  # as vLLM's proposer: the pass writes the drafter's cache
        older = held.make_room(cad.block_table_tensor[: cad.num_reqs], proposer.block_size)
        if older is None and holdable and held.hold(features, positions, slots):
            return  # finished requests' rows dropped from a full store: the live ones stay held
        if older is None:  # room made, yet not enough: the writes still held go first (they are older)
            write_deferred(proposer, cad)
        else:
            write_context(proposer, *older)
        if not (holdable and held.hold(features, positions, slots)):  # a large step to copy, or larger than the store
            write_context(proposer, features, positions, slots)


def hold_plain_step(proposer, target_positions, target_hidden_states, cad) -> None:
    """A step that drafts nothing: its context is held."""
    proposer.num_speculative_tokens = 0
    proposer._last_draft_probs = None
    hold_context(proposer, target_positions, target_hidden_states, cad)


def plain_step(proposer, target_positions, target_hidden_states, cad) -> torch.Tensor:
    """A step that drafts nothing: its context is held and no drafts are returned."""
    hold_plain_step(proposer, target_positions, target_hidden_states, cad)
    return torch.empty(cad.batch_size(), 0, device=target_hidden_states.device, dtype=torch.int64)


def _make_wrapper(original):
    @functools.wraps(original)
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):
        if num_speculative_tokens != 0:
            write_deferred(self, common_attn_metadata)
            return original(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                            next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                            mm_embed_inputs, num_rejected_tokens_gpu, slot_mappings)
        return plain_step(self, target_positions, target_hidden_states, common_attn_metadata)

    return propose


def apply() -> bool:
    from vllm.v1.spec_decode.dflash import DFlashProposer

    return wrap_method(DFlashProposer, "propose", ledger_signature(TARGET), _make_wrapper, inherited=True)
