"""Patch: a draft-free step of V1's runner samples as an engine without speculation (see LEDGER).

After sampling, V1's ``sample_tokens`` runs its speculative block on every step of a speculating
engine: whether the drafter's input fits, which kind of drafter it is, the call into the proposer, a
copy of its drafts for the scheduler, and the KV connector's deferred finalize. On a step that
``gpu_model_runner_inputs`` prepared on the plain path the proposer only holds the step's drafter
context (``gpu_model_runner_propose``), so that step runs vLLM's own ``sample_tokens`` with the
speculative config hidden (one sampled token per request, vLLM's plain bookkeeping) and then holds
the context itself, from the step state vLLM kept for sampling, and finalizes the KV connector. On a
hybrid target it also records one accepted token per request, the state vLLM's speculative path leaves
after a step without drafts (the Gated DeltaNet layers read it on the next step): the host counts that
the next step's input preparation copies to the device, and the device counts themselves. vLLM's own
update derives them from the sampled tokens, which cost 42 us a step on CPU (trained Qwen3.6 pair, batch 1).
The step hands the scheduler no drafts, as ``gpu_model_runner_propose``'s empty list does.
Measured on CPU (predictable target, batch 1, 1.6 ms steps): vLLM's speculative block cost 13 us a step
and the call into the proposer 5 us more.
"""

from __future__ import annotations

import functools

import torch

from vllm_luce.patches import ledger_signature, wrap_method
from vllm_luce.patches.gpu_model_runner_inputs import draft_free_output, without_speculative_config
from vllm_luce.patches.gpu_model_runner_propose import hold_step_context, holds_by_reference

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner.sample_tokens"


def samples_plain(runner, state) -> bool:
    """The step vLLM kept for sampling is the one ``gpu_model_runner_inputs`` prepared on the plain path, and
    the runner schedules synchronously (the asynchronous path hands sampled tokens to the next step through the
    proposer's bookkeeping)."""
    return (state is not None and draft_free_output(runner) is state.scheduler_output
            and not runner.use_async_scheduling)


def record_one_accepted_token(runner, n: int) -> None:
    """What vLLM's ``_update_states_after_model_execute`` records for ``n`` requests that each sampled one token
    (its path without ``align`` state copies, which ``gpu_model_runner_inputs`` never sends here): one accepted
    token per request, on the host (the input batch's counts, which the next step copies to the device) and on
    the device."""
    runner.input_batch.num_accepted_tokens_cpu[:n] = 1
    runner.num_accepted_tokens.gpu[:n].fill_(1)


def is_hybrid(runner) -> bool:
    """``model_config.is_hybrid`` (a property that walks the layer types on each read), kept on the runner."""
    hybrid = getattr(runner, "_luce_is_hybrid", None)
    if hybrid is None:
        hybrid = runner._luce_is_hybrid = runner.model_config.is_hybrid
    return hybrid


def _make_wrapper(original):
    # vLLM's sample_tokens enters inference mode itself. The hold by reference (CPU) only keeps the step's tensors,
    # and a full store's write enters inference mode there (dflash_proposer), so it runs without the context (a
    # few us a step); the copying store copies into its buffers and keeps it.
    @functools.wraps(original)
    def sample_tokens(self, grammar_output):
        state = self.execute_model_state
        if not samples_plain(self, state):
            return original(self, grammar_output)
        output = without_speculative_config(original, self, grammar_output)
        if is_hybrid(self):  # what vLLM's speculative path records: one accepted token per row
            record_one_accepted_token(self, len(output.req_ids))
        args = (self, state.scheduler_output, state.hidden_states, state.aux_hidden_states,
                state.spec_decode_common_attn_metadata)
        if holds_by_reference(self):
            hold_step_context(*args)
        else:
            with torch.inference_mode():
                hold_step_context(*args)
        self.finalize_kv_connector()
        return output

    return sample_tokens


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "sample_tokens", ledger_signature(TARGET), _make_wrapper)
