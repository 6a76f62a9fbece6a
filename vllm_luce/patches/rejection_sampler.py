"""Patch: a step with no drafts skips V1's rejection sampler and samples as a plain engine does (see LEDGER).

V1's model runner sends every step of a speculating engine through the rejection sampler, drafts or
not. With none (the DFlash gate's plain steps), its output is the bonus token alone: the sampler's
draw on the bonus logits. Here that draw is made directly, without the per-step rejection kernels,
the float32 copy of the target logits and the full-vocabulary log-probabilities the bonus draw is
asked for. Steps that want log-probabilities, and synthetic acceptance, keep vLLM's path.
"""

from __future__ import annotations

import functools

from vllm_luce.patches import ledger_signature, wrap_method

TARGET = "vllm.v1.sample.rejection_sampler:RejectionSampler.forward"


def bonus_only(metadata, sampling_metadata, synthetic_mode: bool) -> bool:
    """The step verifies no draft and wants nothing but the sampled tokens."""
    return (metadata.max_spec_len == 0 and not synthetic_mode and sampling_metadata.max_num_logprobs is None
            and not sampling_metadata.logprob_token_ids)


def _make_wrapper(original):
    @functools.wraps(original)
    def forward(self, metadata, draft_probs, logits, sampling_metadata):
        if not bonus_only(metadata, sampling_metadata, self.synthetic_mode):
            return original(self, metadata, draft_probs, logits, sampling_metadata)
        out = self.sampler(logits=logits[metadata.bonus_logits_indices], sampling_metadata=sampling_metadata,
                           predict_bonus_token=True)
        out.sampled_token_ids = out.sampled_token_ids.view(-1, 1)
        return out

    return forward


def apply() -> bool:
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    return wrap_method(RejectionSampler, "forward", ledger_signature(TARGET), _make_wrapper)
