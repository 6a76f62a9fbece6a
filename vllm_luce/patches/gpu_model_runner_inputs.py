"""Patch: a step that verifies no draft and drafts none takes V1's plain input path (see LEDGER).

V1's runner builds speculative metadata on every step of a speculating engine
(``_calc_spec_decode_metadata``) and then samples through the rejection sampler, drafts or not. On the
DFlash gate's plain steps there is nothing to verify, so the step's inputs are what an engine without
speculation builds: one logit per request, no speculative metadata, vLLM's plain sampler. Only the
hybrid targets' Gated DeltaNet layers still need the speculative path (it applies each request's
accepted-token offset to its recurrent state), so their per-row draft counts are set as vLLM sets them
for a step without drafts. Where that path would apply no offset (every request is decoding and
accepted one token last step) and ``cpu_gdn_nonspec`` serves it, the counts say "no speculative rows"
instead, so the step builds the Gated DeltaNet metadata and runs the decode of an engine without
speculation.

The proposer then runs with no speculative metadata, which ``gpu_model_runner_propose`` serves (it
holds the step's context and drafts nothing); this path is taken only where that one is. The step's
scheduler output is kept on the runner (``draft_free_output``): ``gpu_model_runner_preprocess`` and
``gpu_model_runner_sample`` take their plain paths for that step only.
"""

from __future__ import annotations

import functools

import numpy as np

from vllm_luce.patches import cpu_gdn_nonspec, ledger_signature, wrap_method
from vllm_luce.patches.gpu_model_runner_propose import holds_plain_step

TARGET = "vllm.v1.worker.gpu_model_runner:GPUModelRunner._prepare_inputs"


def draft_free_step(runner, scheduler_output) -> bool:
    """Nothing to verify, nothing to draft, and the proposer holds the context itself."""
    return (runner.speculative_config is not None
            and not any(scheduler_output.scheduled_spec_decode_tokens.values())
            and runner.cache_config.mamba_cache_mode != "align"
            and holds_plain_step(runner, scheduler_output))


def without_speculative_config(call, runner, *args):
    """``call(runner, *args)`` with the runner's speculative config hidden (None), as in an engine without
    speculation; restored afterwards, also when the call raises."""
    spec, runner.speculative_config = runner.speculative_config, None
    try:
        return call(runner, *args)
    finally:
        runner.speculative_config = spec


def draft_free_output(runner):
    """The scheduler output of the step whose inputs this patch prepared on the plain path; None after any
    other step."""
    return getattr(runner, "_luce_draft_free_output", None)


def reads_draft_counts(runner) -> bool:
    """Whether a metadata builder of the runner reads the per-row draft counts: vLLM passes them only to
    its recurrent-state builders (Mamba2, Gated DeltaNet, linear attention, short conv). Worked out on
    the first step and kept on the runner; a target without such layers skips the counts (17 us of a
    2 ms plain step on CPU at batch 16)."""
    reads = getattr(runner, "_luce_reads_draft_counts", None)
    if reads is None:
        from vllm.v1.worker import gpu_model_runner as G

        readers = (G.Mamba2AttentionMetadataBuilder, G.GDNAttentionMetadataBuilder,
                   G.BailingLinearAttentionMetadataBuilder, G.ShortConvAttentionMetadataBuilder)
        reads = runner._luce_reads_draft_counts = any(
            isinstance(group.get_metadata_builder(), readers) for groups in runner.attn_groups for group in groups)
    return reads


def zero_draft_decode_counts(num_computed: np.ndarray, num_prompt: np.ndarray,
                             num_scheduled: np.ndarray) -> np.ndarray:
    """vLLM's per-row draft counts for a step without drafts: 0 for a decode row (one token, past its
    prompt), -1 for a prompt chunk."""
    return np.where((num_computed >= num_prompt) & (num_scheduled == 1), 0, -1).astype(np.int32)


def gdn_draft_counts(num_computed: np.ndarray, num_prompt: np.ndarray, num_scheduled: np.ndarray,
                     num_accepted: np.ndarray, plain_decode: bool) -> np.ndarray:
    """The per-row draft counts of a draft-free step. With ``plain_decode`` (the non-speculative Gated
    DeltaNet path decodes like a plain engine), a step whose rows all decode with no accepted-token
    offset (accepted 1) marks every row -1: no row needs the speculative path."""
    counts = zero_draft_decode_counts(num_computed, num_prompt, num_scheduled)
    if plain_decode and len(counts) and not counts.any() and (num_accepted == 1).all():
        counts.fill(-1)
    return counts


def _make_wrapper(original):
    @functools.wraps(original)
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        self._luce_draft_free_output = None  # set once vLLM's code has prepared a draft-free step
        if not draft_free_step(self, scheduler_output):
            return original(self, scheduler_output, num_scheduled_tokens)
        out = without_speculative_config(original, self, scheduler_output, num_scheduled_tokens)
        self._luce_draft_free_output = scheduler_output
        if not reads_draft_counts(self):
            return out
        n = self.input_batch.num_reqs
        counts = self.num_decode_draft_tokens
        counts.np[:n] = gdn_draft_counts(self.input_batch.num_computed_tokens_cpu[:n],
                                         self.input_batch.num_prompt_tokens[:n], num_scheduled_tokens[:n],
                                         self.num_accepted_tokens.np[:n], cpu_gdn_nonspec.ACTIVE)
        counts.np[n:].fill(-1)
        counts.copy_to_gpu()
        return out

    return _prepare_inputs


def apply() -> bool:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return wrap_method(GPUModelRunner, "_prepare_inputs", ledger_signature(TARGET), _make_wrapper)
