"""Sampling stays exact under the DFlash gate (issue 64): at temperature 1, the tokens a gated DFlash engine samples
are distributed as an engine without speculation samples them, while the gate switches between speculative and plain
steps and requests that verify drafts share steps with requests that do not.

Through real vLLM on CPU with the trained pair (qwen36-target and its drafter qwen36-dflash), in process:
  * the reference: the target alone, ``PER_PROMPT`` unseeded requests per prompt at temperature 1;
  * the gated engine: the same requests, the gate switching every few steps (``SWITCHING``), every
    ``DECLINE_EVERY``-th request declining speculation (``luce_dflash: off``), and ``max_tokens`` varying so that
    requests finish and are admitted at different steps: a step mixes verifying, plain and prefilling requests;
  * the biased sampler: the reference engine at ``BIASED_TEMPERATURE``.

Statistic: per request, generated tokens 2-4 as one outcome (the first token comes from the prompt's prefill, which
never verifies drafts); per prompt a table of outcomes against engines, rare outcomes merged so that every expected
count is at least ``MIN_EXPECTED``; the chi-square test of homogeneity summed over the prompts
(``fixtures/homogeneity.py``, unit-tested in tests/spec_decode/test_sampling_homogeneity.py). Requests are
independent draws: unseeded requests share their engine's generator, and the engines are seeded differently. Both
the gated engine's requests (all of them) and its drafting ones alone are compared with the reference.

False failures, below 1e-4 together:
  * each of the two comparisons rejects an exact sampler with probability ``ALPHA`` = 1e-5 (the chi-square
    approximation; the procedure rejected 3.7-7.5% of random halvings of 1,152 and 2,200 reference samples at 0.05);
  * the biased sampler must reach the 1e-5 critical value, 73.5 at its 29 degrees of freedom. Its statistic is
    about 280 (p = 8e-43), so a noncentrality of about 250; at 150 the chance to fall short is 1.5e-7 (a
    noncentral chi-square drawn 20 million times).
The run is deterministic for a given host and code: the bound is over what a change of either draws.
"""

from __future__ import annotations

from collections import Counter

import pytest

from fixtures.homogeneity import homogeneity_test
from fixtures.trained import trained_model
from vllm_luce.spec_decode.gate import GateConfig, SpecGate

pytestmark = pytest.mark.e2e

# Code prompts whose next tokens the trained target is fairly sure of: most of their samples fall in a few outcomes.
PROMPTS = ["import numpy as np\nimport", "def __init__(self", "if __name__ == ", "from typing import",
           "except Exception as e:\n        ", "self.assertEqual(", "import os\nimport", "x = [1, 2,",
           "import json\n\nclass Encoder"]
PER_PROMPT = 128
DECLINE_EVERY = 4
COMPARED = slice(1, 4)  # generated tokens 2-4
MAX_TOKENS = (4, 5, 6, 7)  # by request: those beyond the compared ones desynchronise the batch
DRAFTS = 4  # a verify step at token 2 covers tokens 2-6: all the compared ones
ALPHA = 1e-5
MIN_EXPECTED = 5  # the smallest expected count of a cell
BIASED_TEMPERATURE = 0.6
# The gate switches every few steps: calibration runs of both modes, then an exploration every 3 steps.
SWITCHING = GateConfig(run_length=2, explore_every=3, max_explore_every=3, min_samples=1, patience=1, retry_after=3)


def build(seed: int, drafter=None):
    from vllm import LLM

    spec = None if drafter is None else {"method": "dflash", "model": str(drafter), "num_speculative_tokens": DRAFTS}
    return LLM(model=str(trained_model("qwen36-target")), speculative_config=spec, dtype="bfloat16",
               enforce_eager=True, seed=seed, max_model_len=256, max_num_seqs=64,
               enable_prefix_caching=False, disable_log_stats=drafter is None)


def requests(temperature: float, decline: bool) -> tuple[list[str], list]:
    """Each prompt ``PER_PROMPT`` times, interleaved, and their sampling parameters."""
    from vllm import SamplingParams

    prompts, params = [], []
    for i in range(PER_PROMPT * len(PROMPTS)):
        declined = decline and i % DECLINE_EVERY == DECLINE_EVERY - 1
        prompts.append(PROMPTS[i % len(PROMPTS)])
        max_tokens = MAX_TOKENS[i // DECLINE_EVERY % len(MAX_TOKENS)]
        params.append(SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True,
                                     extra_args={"luce_dflash": "off"} if declined else None))
    return prompts, params


def outcomes(prompts, params, outs, drafting_only: bool = False) -> list[tuple]:
    """(prompt, generated tokens 2-4) per request; ``drafting_only``: of the requests that did not decline."""
    return [(prompt, tuple(out.outputs[0].token_ids[COMPARED]))
            for prompt, p, out in zip(prompts, params, outs, strict=True) if not (drafting_only and p.extra_args)]


class StepRecorder:
    """Wraps the scheduler's ``schedule``: per step, how many requests it schedules and how many of them verify
    drafts; the requests that verified drafts for one of their compared tokens (sampled it in verification)."""

    def __init__(self, scheduler):
        self.scheduler, self.steps, self.verified_compared = scheduler, [], set()
        self.schedule = scheduler.schedule
        scheduler.schedule = self

    def __call__(self, *args, **kwargs):
        output = self.schedule(*args, **kwargs)
        verifying = [r for r, drafts in output.scheduled_spec_decode_tokens.items() if drafts]
        self.steps.append((len(output.num_scheduled_tokens), len(verifying)))
        first, last = COMPARED.start, COMPARED.stop - 1  # output tokens before the first and the last compared one
        self.verified_compared |= {r for r in verifying
                                   if first <= self.scheduler.requests[r].num_output_tokens <= last}
        return output

    def close(self):
        del self.scheduler.schedule


@pytest.fixture(scope="module")
def samples():
    from fixtures.engine_report import llm_counters

    plain = build(seed=1)
    prompts, params = requests(1.0, decline=False)
    reference = outcomes(prompts, params, plain.generate(prompts, params, use_tqdm=False))
    prompts, params = requests(BIASED_TEMPERATURE, decline=False)
    biased = outcomes(prompts, params, plain.generate(prompts, params, use_tqdm=False))
    del plain

    gated = build(seed=2, drafter=trained_model("qwen36-dflash"))
    try:
        scheduler = gated.llm_engine.engine_core.engine_core.scheduler
        scheduler.luce_gate = SpecGate(SWITCHING)
        recorder = StepRecorder(scheduler)
        prompts, params = requests(1.0, decline=True)
        try:
            outs = gated.generate(prompts, params, use_tqdm=False)
        finally:
            recorder.close()
        counters = llm_counters(gated, ("vllm:spec_decode_num_",), labels=False)
        yield {"reference": reference, "biased": biased, "gated": outcomes(prompts, params, outs),
               "drafting": outcomes(prompts, params, outs, drafting_only=True),
               "decisions": dict(scheduler.luce_gate.decisions), "steps": recorder.steps,
               "verified_compared": len(recorder.verified_compared), "counters": counters}
    finally:
        del gated


def test_the_gate_switched_in_mixed_batches_and_drafts_were_accepted_and_rejected(samples):
    decisions, steps, counters = samples["decisions"], samples["steps"], samples["counters"]
    assert decisions["spec"] >= 10 and decisions["plain"] >= 10, decisions
    mixed = [s for s in steps if 0 < s[1] < s[0]]  # some requests verify drafts, others of the step do not
    assert len(mixed) >= 10, steps
    drafting = len(samples["drafting"])
    # at least half of the drafting requests sampled a compared token in verification
    assert samples["verified_compared"] >= drafting // 2, (samples["verified_compared"], drafting)
    drafted = counters["vllm:spec_decode_num_draft_tokens"]
    assert 0 < counters["vllm:spec_decode_num_accepted_tokens"] < drafted, counters
    print(f"gate {decisions}, {len(mixed)} mixed steps of {len(steps)}, {samples['verified_compared']} of {drafting} "
          f"drafting requests sampled a compared token in verification, {counters}")


def describe(result) -> str:
    return (f"chi-square {result.statistic:.1f} over {result.degrees_of_freedom} degrees of freedom, "
            f"p = {result.p_value:.3g}")


@pytest.mark.parametrize("which", ["gated", "drafting"])
def test_gated_tokens_are_distributed_as_without_speculation(samples, which):
    result = homogeneity_test(samples[which], samples["reference"], MIN_EXPECTED)
    print(f"{which} against no speculation: {describe(result)}")  # pytest -s shows it
    assert result.p_value >= ALPHA, f"{which} requests sample otherwise than without speculation: {describe(result)}"


def test_the_same_test_rejects_a_biased_sampler(samples):
    result = homogeneity_test(samples["drafting"], samples["biased"], MIN_EXPECTED)
    print(f"drafting against temperature {BIASED_TEMPERATURE}: {describe(result)}")
    assert result.p_value < ALPHA, f"a sampler at temperature {BIASED_TEMPERATURE} passed: {describe(result)}"
    sizes = Counter(prompt for prompt, _ in samples["drafting"])
    assert set(sizes) == set(PROMPTS) and min(sizes.values()) >= PER_PROMPT // 2, sizes
