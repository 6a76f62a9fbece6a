"""The DFlash gate through real vLLM (CPU, V1 runner): output is unchanged while it switches
between speculative and plain steps, on tiny Qwen3.6 (hybrid GDN), Gemma 4 and Laguna targets
with random drafters, and on the trained Qwen3.6 pair; sampled requests run under it. Plain steps'
drafter context, held and written in one pass, gives the drafts that per-step passes give."""

import pytest

from tests.e2e.dflash_probe import assert_same_until_near_tie, greedy_with_margins
from vllm_luce.spec_decode.gate import GateConfig, SpecGate

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
    from tests.fixtures.trained import trained_model

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
        assert sum(gate.decisions.values()) > 0 and gate.regimes, gate.summary()
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


def test_drafts_are_the_same_with_plain_steps_context_held_and_written_each_step(trained_pair):
    """Plain steps hold their drafter context and the next drafting step writes it in one pass
    (spec_decode/deferred_context.py). The drafts must be the ones per-step context passes give:
    the same engine and schedule, with a store that holds nothing, writes each plain step's
    context in that step. Both stores: by reference (what runs on CPU) and in buffers (on a GPU)."""
    from benchmarks import fidelity as F
    from tests.e2e.dflash_probe import drafts_by_prompt
    from vllm_luce.patches.gpu_model_runner_propose import features_are_new_tensors
    from vllm_luce.spec_decode.deferred_context import DeferredContext, DeferredContextByReference

    target, drafter = trained_pair
    llm = build(target, drafter, max_len=1024)
    try:
        sched = scheduler(llm)
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        proposer = runner.drafter
        prompts = F.code_prompts(llm.get_tokenizer(), 4)
        runs = {}
        assert features_are_new_tensors(runner)  # the CPU engine holds by reference
        # The engine's first run drafts differently from later ones (cause not found; measured: three later
        # runs, either store, drafted identically), so the two stores run after it and must agree exactly.
        for mode, store in (("each step", DeferredContext(1, max_bytes=1)),
                            ("held", DeferredContextByReference(8 * proposer.max_num_tokens)),
                            ("in buffers", DeferredContext(proposer.max_num_tokens))):
            proposer._luce_deferred = store
            sched.dynamic_sd_lookup = AlternatingLookup(sched.luce_max_spec_tokens)
            runs[mode] = drafts_by_prompt(llm, prompts, 48)
        (held, out_held), (each, out_each) = runs["held"], runs["each step"]
        assert out_held == out_each == runs["in buffers"][1]
        assert runs["in buffers"][0] == held  # the two stores hold the same writes
        steps = sum(len(v) for v in each.values())
        assert steps >= 8 and all(each.values()), each  # every prompt drafted after plain steps
        common = [(held[i][n], d) for i in each for n, d in each[i].items() if n in held[i]]
        same = sum(a == b for x, y in common for a, b in zip(x, y)) / sum(len(y) for _, y in common)
        first = sum(x[0] == y[0] for x, y in common) / len(common)
        # The one-pass write batches the drafter's projections differently (bf16 rounding), so a
        # low-confidence draft position may flip, and a different acceptance shifts later lengths.
        # Measured: 99.6% of tokens and every first token agree; a store that drops the held context
        # (the drafter never sees plain steps' tokens) agrees on 42% and 51%.
        assert len(common) >= 0.75 * steps and same >= 0.95 and first >= 0.95, (len(common), steps, same, first)
    finally:
        del llm


def test_requests_admitted_as_others_finish_keep_their_output(trained_pair):
    """96 requests through 32 sequence slots, the gate switching every 4 steps: finished requests' blocks go
    to new ones while plain steps' drafter context is held. On this hybrid target the drafter's KV blocks
    share memory with the Gated DeltaNet state blocks, so a held write for a finished request would land
    in a new request's recurrent state (before the fix: 3 of 48 greedy outputs changed at tokens 1-3). Then
    again in two waves with a small store, which makes room by dropping the first wave's rows."""
    from benchmarks import load_test as L
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
        # Two waves of 32 in 60 plain steps, with a store 1.6x the first wave's rows: it fills in the second wave,
        # drops the first wave's rows and keeps the live ones held, without a pass
        # (DeferredContextByReference.make_room); the drafting steps after it write them. The outputs stay the same.
        from vllm_luce.spec_decode.deferred_context import DeferredContextByReference

        tokenizer = llm.get_tokenizer()
        first_wave = sum(len(tokenizer(p).input_ids) for p in prompts[:32]) + 32 * 40
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
        store = runner.drafter._luce_deferred = DeferredContextByReference(max_tokens=first_wave * 8 // 5)
        rooms, make_room = [], store.make_room
        store.make_room = lambda *args: rooms.append(make_room(*args)) or rooms[-1]
        sched.dynamic_sd_lookup = AlternatingLookup(sched.luce_max_spec_tokens, plain=60)
        outs = [o for wave in (prompts[:32], prompts[32:]) for o in llm.generate(wave, params, use_tqdm=False)]
        assert None in rooms, [r if r is None else len(r[2]) for r in rooms]  # room made, nothing written
        assert sched.dynamic_sd_lookup.calls > 60  # and drafting steps after it
        assert assert_same_until_near_tie(expected, margins, [list(o.outputs[0].token_ids) for o in outs]) >= 48
    finally:
        del llm
