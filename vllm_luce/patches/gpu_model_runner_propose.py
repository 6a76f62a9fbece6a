"""Patch: a plain step (K = 0) of V1's runner goes straight to holding the DFlash drafter's context (see LEDGER).

On every step of a speculating engine V1's runner prepares the proposer's inputs before calling it:
next-token ids and valid-token counts for the drafter's first query position
(``prepare_next_token_ids_padded``) and, after a verify step, the padded drafter metadata
(``prepare_inputs_padded``). A plain step drafts nothing, so neither is read: the held context
(``patches/dflash_proposer.py``) needs only the step's target features, positions and slots, which
are every scheduled token's, exactly what vLLM's padded path would pass. Profiled on CPU (trained
Qwen3.6 pair, batch 1) that preparation cost 0.2 ms of a 5.4 ms step.

The valid-token counts feed nothing else unless the runner copies them back for asynchronous
speculative decoding (``valid_sampled_token_count_event``, ``use_async_spec_decode``); such a
runner, a drafter other than DFlash, or multimodal drafter inputs keep vLLM's path.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.patches import ledger_signature, wrap_method
from vllm_luce.patches.dflash_proposer import deferred, hold_plain_step
from vllm_luce.spec_decode.deferred_context import DeferredContextByReference

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.propose_draft_token_ids"


def holds_plain_step(runner, scheduler_output) -> bool:
    """This step drafts nothing and nothing downstream reads the proposer's prepared inputs. The runner's
    conditions are read first: working them out makes the drafter's store, and a drafting first step (a
    gate decision to speculate) would otherwise make the copying one in vLLM's path."""
    return runner_holds_plain_steps(runner) and scheduler_output.num_spec_tokens_to_schedule == 0


def runner_holds_plain_steps(runner) -> bool:
    """A DFlash drafter, a padded drafter batch, no asynchronous speculative decoding, no multimodal drafter
    inputs, no MTP target. All are fixed once the runner has its model, so this is worked out on the first
    step and kept on the runner (every step asks it, twice with ``gpu_model_runner_inputs``)."""
    held = getattr(runner, "_luce_holds_plain_steps", None)
    if held is None:
        from vllm.v1.spec_decode.dflash import DFlashProposer

        held = runner._luce_holds_plain_steps = (
            isinstance(runner.drafter, DFlashProposer) and not runner.speculative_config.disable_padded_drafter_batch
            and runner.valid_sampled_token_count_event is None and not runner.use_async_spec_decode
            and not (runner.supports_mm_inputs and runner.drafter.supports_mm_inputs)
            and getattr(runner.get_model(), "get_mtp_target_hidden_states", None) is None)
        if held:  # the drafter's store of held context, made here once
            deferred(runner.drafter, by_reference=features_are_new_tensors(runner))
    return held


def holds_by_reference(runner) -> bool:
    """Whether the runner's drafter holds plain steps' context by reference (``features_are_new_tensors``)."""
    return isinstance(deferred(runner.drafter), DeferredContextByReference)


def features_are_new_tensors(runner) -> bool:
    """Whether each step's target features are new tensors that nothing writes after the step, so a plain
    step's drafter context can be held without copying them: the target layers' outputs on CPU (vLLM runs
    no CUDA graphs there, whose outputs are fixed buffers), unless one is layer 0's input, which can be the
    runner's input-embeddings buffer. The layers are read as vLLM's runner picks them (the drafter's config,
    else the model's default); anything unexpected keeps the copying store."""
    try:
        layers = (runner._get_eagle3_aux_layers_from_config()
                  or runner.get_model().get_eagle3_default_aux_hidden_state_layers())
        return bool(runner.use_aux_hidden_state_outputs and torch.device(runner.device).type == "cpu"
                    and 0 not in layers)
    except AttributeError:
        return False


def hold_step_context(runner, scheduler_output, hidden_states, aux_hidden_states, common_attn_metadata) -> None:
    """Hold a plain step's drafter context: every scheduled token's target features (the target layers' outputs
    where the drafter reads them), positions and slots."""
    n = scheduler_output.total_num_scheduled_tokens
    features = aux_hidden_states if runner.use_aux_hidden_state_outputs else hidden_states  # cut to n when held
    hold_plain_step(runner.drafter, runner._get_positions(n), features, common_attn_metadata)


def _make_wrapper(original):
    @functools.wraps(original)
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                                sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                                slot_mappings):
        if not holds_plain_step(self, scheduler_output):
            return original(self, scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                            sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
                            slot_mappings)
        self._draft_probs = self._draft_prob_req_ids = None
        hold_step_context(self, scheduler_output, hidden_states, aux_hidden_states, common_attn_metadata)
        # No drafts, as an empty list: V1 keeps a list (a CPU drafter's per-request drafts) as it is, so this
        # skips the device-to-host copy of an empty draft tensor, and ``gpu_model_runner`` hands the
        # scheduler nothing to update. Measured on CPU at batch 16: about 70 us of a 3 ms step.
        return []

    return propose_draft_token_ids


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "propose_draft_token_ids", ledger_signature(TARGET), _make_wrapper)
