"""The DFlash gate through real vLLM (CPU, V1 runner): output is unchanged while it switches
between speculative and plain steps, on tiny Qwen3.6 (hybrid GDN), Gemma 4 and Laguna targets
with random drafters, and on the trained Qwen3.6 pair; sampled requests run under it; requests admitted as
others finish keep their output while plain steps write the drafter's context."""

import pytest

from tests.e2e.dflash_probe import assert_same_until_near_tie, greedy_with_margins
from vllm_luce.spec_decode.gate import GateConfig, SpecGate
from vllm_luce.spec_decode.gate_report import summary

pytestmark = pytest.mark.e2e
PROMPTS = ["def fibonacci(n):\n    ", "import json\n\nclass Encoder", "The quick brown fox", "x = [1, 2,"]
FAMILIES = ["qwen3_6", "gemma4", "laguna"]
# Switch every few steps: calibration runs of both modes, then an exploration every 3 steps.
SWITCHING = GateConfig(run_length=2, explore_every=3, max_explore_every=3, min_samples=1, patience=1, retry_after=3)


def build(model, drafter=None, max_len=512):
    from vllm import LLM

    spec = None if drafter is None else {"model": str(drafter)}
    return LLM(model=str(model), speculative_config=spec, enforce_eager=True, max_model_len=max_len,
               dtype="bfloat16", seed=0, enable_prefix_caching=False, disable_log_stats=False)


def scheduler(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


def greedy(llm, max_tokens=24):
    from vllm import SamplingParams

    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_unchanged_while_the_gate_switches(family, tiny_model, tiny_drafter):
    plain = build(tiny_model(family))
    expected, margins = greedy_with_margins(plain, PROMPTS, 24)
    del plain
    llm = build(tiny_model(family), tiny_drafter(family))
    try:
        sched = scheduler(llm)
        assert type(sched).__name__ == "LuceGatedScheduler"
        sched.luce_gate = SpecGate(SWITCHING)
        assert_same_until_near_tie(expected, margins, greedy(llm))
        decisions = sched.luce_gate.decisions
        assert decisions["spec"] > 0 and decisions["plain"] > 0, decisions
    finally:
        del llm


@pytest.fixture(scope="module")
def trained_pair():
    from fixtures.trained import trained_model

    return trained_model("qwen36-target"), trained_model("qwen36-dflash")


def test_trained_pair_unchanged_with_the_default_gate_and_released_state(trained_pair):
    target, drafter = trained_pair
    plain = build(target, max_len=1024)
    expected, margins = greedy_with_margins(plain, PROMPTS, 64)
    del plain
    llm = build(target, drafter, max_len=1024)
    try:
        sched = scheduler(llm)
        # A trained model has few near-ties: most sequences must match in full.
        assert assert_same_until_near_tie(expected, margins, greedy(llm, 64)) >= len(PROMPTS) - 1
        gate = sched.luce_gate
        assert sum(gate.decisions.values()) > 0 and gate.regimes, summary(gate)
        assert gate.requests == {}, "finished requests keep gate state"
        # Sampled requests (temperature 0.8, fixed seeds) under a switching gate: all complete, and the
        # per-request draft stop engages and releases.
        from vllm import SamplingParams

        sched.luce_gate = SpecGate(SWITCHING)
        params = [SamplingParams(max_tokens=32, temperature=0.8, seed=i, ignore_eos=True) for i in range(8)]
        outs = llm.generate(PROMPTS * 2, params, use_tqdm=False)
        assert [len(o.outputs[0].token_ids) for o in outs] == [32] * 8
        assert sched.luce_gate.decisions["spec"] > 0 and sched.luce_gate.decisions["plain"] > 0
        assert sched.luce_gate.requests == {}
        # Greedy requests batched with sampled ones keep their output (vLLM's CPU rejection sampler
        # divided every row's logits by garbage temperatures in such batches: patches/cpu_expand_kernel.py).
        mixed = [SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)] * len(PROMPTS) + params[:4]
        outs = llm.generate(PROMPTS * 2, mixed, use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs[:len(PROMPTS)]]
        assert assert_same_until_near_tie(expected, margins, got) >= len(PROMPTS) - 1
    finally:
        del llm


class AlternatingLookup:
    """K by step: ``plain`` plain steps (four), then four drafting ones, repeated (the same in every run)."""

    def __init__(self, k: int, plain: int = 4):
        self.k, self.plain, self.calls = k, plain, 0

    def __getitem__(self, batch_size: int) -> int:
        self.calls += 1
        return self.k if self.calls % (self.plain + 4) >= self.plain else 0


def test_requests_admitted_as_others_finish_keep_their_output(trained_pair):
    """64 requests through 32 sequence slots, the engine switching between 4 plain and 4 drafting steps: finished
    requests' blocks go to new ones while plain steps write the drafter's context (patches/dflash_proposer_v1.py).
    On this hybrid target the drafter's KV blocks share memory with the Gated DeltaNet state blocks, so a context
    write to a block no longer the request's would land in a new request's recurrent state."""
    from fixtures import serve_load as L
    from vllm import LLM, SamplingParams

    target, drafter = trained_pair
    prompts = [item.prompt for item in L.workload(96) if item.kind == "short"][:64]
    kw = dict(model=str(target), enforce_eager=True, max_model_len=1024,
              dtype="bfloat16", seed=0, enable_prefix_caching=False, max_num_seqs=32, max_num_batched_tokens=1024)
    plain = LLM(**kw)
    expected, margins = greedy_with_margins(plain, prompts, 40)
    del plain
    llm = LLM(**kw, speculative_config={"model": str(drafter)})
    try:
        sched = scheduler(llm)
        sched.dynamic_sd_lookup = AlternatingLookup(sched.luce_max_spec_tokens)
        params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        assert sched.dynamic_sd_lookup.calls > 40
        assert assert_same_until_near_tie(expected, margins, [list(o.outputs[0].token_ids) for o in outs]) >= 48
    finally:
        del llm
