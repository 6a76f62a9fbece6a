"""The self-calibrating gate core (pure): it measures both modes per batch size and runs the faster one."""

import random

import pytest

from vllm_luce.spec_decode.gate import GateConfig, SpecGate, bucket
from vllm_luce.spec_decode.gate_report import summary


def simulate(gate, steps, spec_tokens_per_s, plain_tokens_per_s, batch=4, spec_tokens=3, totals=None):
    """Drive the gate as the scheduler binding does: drafts of step t are verified at t + 1 unless that step is
    plain (it drops them), and a step is a sample only when it verifies and drafts in the same mode (the first
    step of a speculative run drafts but verifies nothing: it costs a speculative step and commits one token per
    request). Returns the modes; ``totals`` (a list) gets the tokens committed and the seconds spent."""
    modes, drafted_before, tokens_total, seconds_total = [], False, 0, 0.0
    for _ in range(steps):
        spec = gate.decide(batch)
        verifies = drafted_before and spec
        seconds = batch * spec_tokens / spec_tokens_per_s if spec else batch / plain_tokens_per_s
        tokens = batch * (spec_tokens if verifies else 1)
        if spec == verifies:
            gate.observe(speculative=spec, batch_size=batch, committed_tokens=tokens, seconds=seconds)
        modes.append(spec)
        drafted_before, tokens_total, seconds_total = spec, tokens_total + tokens, seconds_total + seconds
    if totals is not None:
        totals[:] = [tokens_total, seconds_total]
    return modes


def accepted_before_a_miss(rng, p: float) -> int:
    """Drafts accepted in a verify step of 15 drafts, each right with probability p: those before the first miss."""
    return next((k for k in range(15) if rng.random() > p), 15)


def gate_measured(batch: int, spec_step_s: float, plain_step_s: float) -> SpecGate:
    """A new gate with one sample of each mode at this batch, every request committing one token (the break-even's
    step times)."""
    gate = SpecGate(GateConfig())
    for spec, s in ((True, spec_step_s), (False, plain_step_s)):
        gate.observe(speculative=spec, batch_size=batch, committed_tokens=batch, seconds=batch * s)
    return gate


def test_bucket_is_the_power_of_two_at_or_above():
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 5, 16, 17)] == [0, 1, 2, 4, 4, 8, 16, 32]


@pytest.mark.parametrize("spec_rate, plain_rate, expect_spec", [(300.0, 100.0, True), (80.0, 100.0, False)])
def test_runs_the_faster_mode_after_calibrating(spec_rate, plain_rate, expect_spec):
    config = GateConfig()
    gate = SpecGate(config)
    modes = simulate(gate, 2000, spec_rate, plain_rate)
    regime = gate.regime(4)
    assert regime.winner(config) is expect_spec
    interval = regime.explore_interval(config)
    assert config.explore_every <= interval <= config.max_explore_every
    calibrated = modes[6 * config.run_length:]
    share = sum(m == expect_spec for m in calibrated) / len(calibrated)
    # Only exploration runs go the other way: run_length steps per interval.
    assert share >= 1 - config.run_length / interval - 0.01, share
    assert gate.explorations >= len(calibrated) // (interval + config.run_length) - 1


def test_decisions_hold_for_a_run_and_calibration_starts_plain():
    gate = SpecGate(GateConfig(run_length=3))
    assert simulate(gate, 6, 200.0, 100.0) == [False] * 3 + [True] * 3


def test_calibration_alternates_even_when_steps_give_no_sample():
    """Steps with prompt tokens are not measured (the binding does not observe them); calibration goes on."""
    gate = SpecGate(GateConfig(run_length=2))
    assert [gate.decide(4) for _ in range(8)] == [False, False, True, True] * 2


def test_follows_a_change_in_which_mode_pays():
    gate = SpecGate()
    simulate(gate, 400, 300.0, 100.0)
    later = simulate(gate, 1200, 50.0, 100.0)  # the text became unpredictable
    assert gate.regime(4).winner(gate.config) is False and sum(later[-300:]) / 300 < 0.1


def test_regimes_are_separate_by_batch_size():
    gate = SpecGate()
    simulate(gate, 300, 300.0, 100.0, batch=1)
    simulate(gate, 300, 50.0, 100.0, batch=64)
    assert gate.regime(1).winner(gate.config) is True and gate.regime(64).winner(gate.config) is False
    assert set(gate.regimes) == {1, 64} and gate.regime(33) is gate.regime(64)
    assert "batch<=1: spec" in summary(gate) and "-> plain" in summary(gate)


def test_a_run_ends_when_the_batch_changes_regime():
    gate = SpecGate(GateConfig(run_length=3))
    assert [gate.decide(4), gate.decide(4)] == [False, False]
    assert gate.decide(16) is False  # a new run in its own regime, plain first
    assert gate.decide(4) is True  # and back: batch 4's second calibration run
    assert gate.regime(16).runs == {True: 0, False: 1} and gate.regime(4).runs == {True: 1, False: 1}


# A near tie is re-run every explore_every steps, the floor, whatever the budget: there a run's transition (a
# speculative step committing one token) is most of the loss, about 1.1% at a 5% gap.
NEAR_TIE_LOSS = 0.015


@pytest.mark.parametrize("spec_rate, plain_rate", [(300.0, 100.0), (100.0, 400.0), (105.0, 100.0)])
def test_exploration_loses_at_most_its_budget(spec_rate, plain_rate):
    """Committed tokens per second over a long run, transitions and explorations included, against always running
    the faster mode (a margin for calibration, which the budget does not cover)."""
    config, totals = GateConfig(), []
    simulate(SpecGate(config), 20_000, spec_rate, plain_rate, totals=totals)
    tokens, seconds = totals
    near_tie = max(spec_rate, plain_rate) / min(spec_rate, plain_rate) < 1.1
    allowed = NEAR_TIE_LOSS if near_tie else 2 * config.explore_budget
    assert tokens / seconds >= max(spec_rate, plain_rate) * (1 - allowed), tokens / seconds


def test_decisive_gaps_are_explored_less_often():
    config = GateConfig()
    gate = SpecGate(config)
    simulate(gate, 200, 110.0, 100.0, batch=1)
    simulate(gate, 200, 25.0, 100.0, batch=64)
    assert gate.regime(1).explore_interval(config) == config.explore_every
    assert gate.regime(64).explore_interval(config) > 4 * config.explore_every


def test_ignores_empty_or_zero_time_steps():
    gate = SpecGate()
    gate.observe(speculative=True, batch_size=4, committed_tokens=0, seconds=1.0)
    gate.observe(speculative=True, batch_size=4, committed_tokens=5, seconds=0.0)
    gate.observe(speculative=True, batch_size=0, committed_tokens=5, seconds=1.0)
    assert all(r.rate[True].samples == 0 for r in gate.regimes.values())


def test_a_batch_with_nothing_to_draft_runs_plain():
    gate = SpecGate(GateConfig(run_length=2, min_samples=1))
    simulate(gate, 20, 300.0, 100.0)  # speculation wins at batch 4
    asked = []
    assert [gate.decide(4, drafting=lambda: asked.append(1) or False) for _ in range(4)] == [False] * 4
    assert asked and gate.decide(4, drafting=True) is True and gate.speculating


def calibrated_gate(spec_step_s, plain_step_s):
    gate = SpecGate(GateConfig(patience=3, retry_after=10, min_request_samples=1))
    for spec, s in ((True, spec_step_s), (False, plain_step_s)):
        gate.observe(speculative=spec, batch_size=4, committed_tokens=4, seconds=4 * s)
    return gate


def test_break_even_is_measured_extra_step_time():
    assert calibrated_gate(0.15, 0.10).regime(4).break_even() == pytest.approx(0.5)
    assert SpecGate().regime(4).break_even() is None


def test_request_below_break_even_stops_drafting_then_retries():
    gate = calibrated_gate(0.15, 0.10)  # break-even: 0.5 accepted tokens per verify step
    for _ in range(3):
        assert gate.request_may_draft("bad")
        gate.observe_request("bad", accepted=0, batch_size=4)
        gate.observe_request("good", accepted=3, batch_size=4)
    assert not gate.request_may_draft("bad") and gate.request_may_draft("good")
    assert len(gate.stopped) == 1 and gate.holds_back
    for _ in range(10):
        gate.decide(4)
    assert gate.request_may_draft("bad")  # retried after retry_after steps
    assert len(gate.stopped) == 0 and gate.requests["bad"].low_streak == 0


def test_a_good_drafters_requests_are_not_stopped_by_chance():
    """Drafts right with probability 0.9 per position (accepted = drafts before the first miss): 128 requests over
    64 verify steps, break-even 4.4 (a speculative step 5.4x a plain one's time, about what a GPU gives at batch
    128). The mean, 7.2 accepted, is above it; requests whose drafts are useless (0) or poor (p 0.5, 1 accepted)
    stop."""
    rng = random.Random(0)
    gate = gate_measured(128, 0.076, 0.014)
    assert gate.regime(128).break_even() == pytest.approx(4.43, abs=0.01)
    for _ in range(64):
        for i in range(128):
            gate.observe_request(f"r{i}", accepted=accepted_before_a_miss(rng, 0.9), batch_size=128)
        gate.observe_request("useless", accepted=0, batch_size=128)
        gate.observe_request("poor", accepted=accepted_before_a_miss(rng, 0.5), batch_size=128)
    assert len(gate.stopped) == 2 and not gate.request_may_draft("useless") and not gate.request_may_draft("poor")


def test_forget_releases_request_state():
    gate = calibrated_gate(0.15, 0.10)
    for i in range(200):
        for _ in range(3):  # odd requests stay below break-even long enough to stop drafting
            gate.observe_request(f"r{i}", accepted=i % 2 == 0, batch_size=4)
        assert gate.request_may_draft(f"r{i}") == (i % 2 == 0)
        gate.forget(f"r{i}")
    assert gate.requests == {} and gate.stopped == {}


def test_a_declined_request_never_drafts_until_forgotten():
    gate = calibrated_gate(0.10, 0.15)
    gate.decline("quiet")
    assert gate.holds_back and not gate.request_may_draft("quiet") and gate.request_may_draft("other")
    for _ in range(3 * gate.config.retry_after):  # no retry brings it back, unlike a request the gate stopped
        gate.decide(4)
    assert not gate.request_may_draft("quiet")
    gate.forget("quiet")
    assert not gate.holds_back and gate.request_may_draft("quiet")


def test_config_is_validated():
    with pytest.raises(ValueError, match="run_length"):
        GateConfig(run_length=1)
    with pytest.raises(ValueError, match="smoothing"):
        GateConfig(smoothing=0.0)
    with pytest.raises(ValueError, match="explore_budget"):
        GateConfig(explore_budget=0.0)
    with pytest.raises(ValueError, match="max_explore_every"):
        GateConfig(explore_every=128, max_explore_every=64)


def test_a_stall_during_calibration_does_not_lock_the_slower_mode():
    """A host stall over the first plain run (its first three steps 40x slower, as a busy shared host can give) is
    outweighed by the second plain run calibration takes: the gate ends up plain with a drafter that
    never pays, instead of speculating until its first re-run of plain, max_explore_every steps later."""
    config = GateConfig()
    gate = SpecGate(config)
    drafted_before, modes = False, []
    for t in range(400):
        spec = gate.decide(4)
        verifies = drafted_before and spec
        seconds = (4 / 900 if spec else 4 / 2900) * (40 if t < 3 else 1)  # spec: 900 tok/s committing 1 a request
        if spec == verifies:
            gate.observe(speculative=spec, batch_size=4, committed_tokens=4, seconds=seconds)
        modes.append(spec)
        drafted_before = spec
    assert gate.regime(4).winner(config) is False, summary(gate)
    assert sum(modes) < 0.1 * len(modes), summary(gate)
    stalled = SpecGate(GateConfig(min_samples=2))  # one run of each mode: the stall decides
    for t in range(12):
        spec = stalled.decide(4)
        stalled.observe(speculative=spec, batch_size=4, committed_tokens=4, seconds=(4 / 900 if spec else 4 / 2900) * (
            40 if t < 3 else 1))
    assert stalled.regime(4).winner(stalled.config) is True


def test_moderate_acceptance_keeps_speculating_through_runs_of_one_token_steps():
    """A drafter right half the time per position at batch 1, with the GPU's step times at batch 1 (6.68 ms
    speculative, 5.31 plain; docs/benchmarks.md's DFlash run): half the verify steps commit one token, yet
    speculation commits 1.44x plain's tokens per second. Rates averaged over too few steps (~4) let chance runs of
    one-token steps flip the regime to plain until its next re-run, a tenth below fixed DFlash; the gate keeps
    speculating on nearly every step."""
    for seed in range(3):
        rng, gate, drafted_before, tokens, seconds = random.Random(seed), SpecGate(GateConfig()), False, 0, 0.0
        for _ in range(4000):
            spec = gate.decide(1)
            verifies = drafted_before and spec
            step = 6.68e-3 if spec else 5.31e-3
            committed = 1 + (accepted_before_a_miss(rng, 0.5) if verifies else 0)
            if spec == verifies:
                gate.observe(speculative=spec, batch_size=1, committed_tokens=committed, seconds=step)
            drafted_before, tokens, seconds = spec, tokens + committed, seconds + step
        always = (1 + sum(0.5 ** j for j in range(1, 16))) / 6.68e-3  # speculating on every step
        assert tokens / seconds > 0.97 * always, (seed, tokens / seconds / always, summary(gate))


def test_averages_start_as_a_plain_mean():
    gate = SpecGate(GateConfig(smoothing=0.1))
    for seconds in (1.0, 0.5, 0.25):  # 1, 2 and 4 tokens/s
        gate.observe(speculative=False, batch_size=1, committed_tokens=1, seconds=seconds)
    assert gate.regime(1).rate[False].value == pytest.approx(7 / 3)


def test_a_drafter_just_above_break_even_keeps_its_requests_drafting():
    """Drafts right half the time (1.0 accepted a verify step) against a break-even of 0.8 (the GPU's step times at
    batch 16): a stop rule of two standard errors over 4 steps would stop a third of such requests by chance within
    250 verify steps, and they would finish last; the gate's stops few. A drafter right 30% of the time (0.43
    accepted) still stops nearly every request."""
    rng = random.Random(0)
    gate = gate_measured(16, 0.0106, 0.0059)
    assert gate.regime(16).break_even() == pytest.approx(0.80, abs=0.01)
    for _ in range(250):
        for i in range(64):
            for name, p in ((f"half{i}", 0.5), (f"poor{i}", 0.3)):
                gate.observe_request(name, accepted=accepted_before_a_miss(rng, p), batch_size=16)
    assert sum(name.startswith("half") for name in gate.stopped) <= 4  # 22 of 64 before
    assert sum(name.startswith("poor") for name in gate.stopped) >= 60
