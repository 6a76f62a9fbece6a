"""The self-calibrating gate core (pure): it measures both modes and runs the faster one."""

import pytest

from vllm_luce.spec_decode.gate import GateConfig, SpecGate, bucket


def simulate(gate, steps, spec_tokens_per_s, plain_tokens_per_s, batch=4, context=2048, prompt=False, spec_tokens=3):
    """Drive the gate as the scheduler binding does: drafts of step t are verified at t + 1 unless that step
    is plain and drops them (``keeps_drafts``), and a step is a clean sample only when it verifies and drafts
    in the same mode. A speculative step commits ``spec_tokens`` per request; a probe's drafts match
    ``spec_tokens - 1`` of the tokens committed after it. Returns the modes."""
    modes, drafted_before = [], False
    for _ in range(steps):
        spec = gate.decide(batch, context, prompt=prompt)
        verifies = drafted_before and (spec or gate.keeps_drafts())
        if spec == verifies:  # clean: the rate of that mode
            rate = spec_tokens_per_s if spec else plain_tokens_per_s
            tokens = batch * (spec_tokens if spec else 1)
            gate.observe(speculative=spec, batch_size=batch, context_tokens=context,
                         committed_tokens=tokens, seconds=tokens / rate, prompt=prompt)
        if gate.probing:
            gate.observe_probe(batch, context, spec_tokens - 1)
        modes.append(spec)
        drafted_before = spec
    return modes


def test_bucket_is_the_power_of_two_at_or_above():
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 5, 16, 17)] == [0, 1, 2, 4, 4, 8, 16, 32]


@pytest.mark.parametrize("spec_rate, plain_rate, expect_spec", [(300.0, 100.0, True), (80.0, 100.0, False)])
def test_runs_the_faster_mode_after_calibrating(spec_rate, plain_rate, expect_spec):
    config = GateConfig()
    gate = SpecGate(config)
    modes = simulate(gate, 640, spec_rate, plain_rate)
    calibrated = modes[4 * config.run_length:]
    share = sum(m == expect_spec for m in calibrated) / len(calibrated)
    # Only exploration runs go the other way: run_length steps per budgeted interval.
    interval = gate.regimes[SpecGate.regime_key(4, 2048)].explore_interval(config)
    assert config.explore_every <= interval <= config.max_explore_every
    assert share >= 1 - config.run_length / interval - 0.02, share
    assert gate.regimes[SpecGate.regime_key(4, 2048)].winner() is expect_spec


def test_decisions_hold_for_a_run():
    gate = SpecGate(GateConfig(run_length=3))
    modes = simulate(gate, 12, 200.0, 100.0)
    assert modes[:6] == [False] * 3 + [True] * 3  # calibration: a run of each, plain first


def test_follows_a_change_in_which_mode_pays():
    gate = SpecGate()
    simulate(gate, 400, 300.0, 100.0)
    later = simulate(gate, 400, 50.0, 100.0)  # e.g. the text became unpredictable
    assert sum(later[-200:]) / 200 < 0.1


def test_regimes_are_separate_by_batch_and_context():
    gate = SpecGate()
    simulate(gate, 300, 300.0, 100.0, batch=1)
    simulate(gate, 300, 50.0, 100.0, batch=64)
    simulate(gate, 300, 50.0, 100.0, batch=1, context=30_000)
    assert gate.regimes[SpecGate.regime_key(1, 2048)].winner() is True
    assert gate.regimes[SpecGate.regime_key(64, 2048)].winner() is False
    assert gate.regimes[SpecGate.regime_key(1, 30_000)].winner() is False
    assert "batch<=1 ctx<=2K" in gate.summary() and "-> plain" in gate.summary()


def test_ignores_empty_or_zero_time_steps():
    gate = SpecGate()
    gate.observe(speculative=True, batch_size=4, context_tokens=10, committed_tokens=0, seconds=1.0)
    gate.observe(speculative=True, batch_size=4, context_tokens=10, committed_tokens=5, seconds=0.0)
    assert gate.regimes.get(SpecGate.regime_key(4, 10)) is None or \
        gate.regimes[SpecGate.regime_key(4, 10)].spec_rate.samples == 0


def calibrated_gate(spec_step_s, plain_step_s):
    gate = SpecGate(GateConfig(patience=3, retry_after=10))
    for spec, s in ((True, spec_step_s), (False, plain_step_s)):
        gate.observe(speculative=spec, batch_size=4, context_tokens=100, committed_tokens=4, seconds=4 * s)
    return gate


def test_break_even_is_measured_extra_step_time():
    gate = calibrated_gate(0.15, 0.10)
    assert gate.regime(4, 100).break_even() == pytest.approx(0.5)


def test_request_below_break_even_stops_drafting_then_retries():
    gate = calibrated_gate(0.15, 0.10)  # break-even: 0.5 accepted tokens per verify step
    for _ in range(3):
        assert gate.request_may_draft("bad")
        gate.observe_request("bad", accepted=0, batch_size=4, context_tokens=100)
        gate.observe_request("good", accepted=3, batch_size=4, context_tokens=100)
    assert not gate.request_may_draft("bad") and gate.request_may_draft("good")
    assert gate.stopped_requests() == 1
    for _ in range(10):
        gate.decide(4, 100)
    assert gate.request_may_draft("bad")  # retried after retry_after steps
    assert gate.stopped_requests() == 0 and gate.requests["bad"].low_streak == 0


def test_forget_releases_request_state():
    gate = calibrated_gate(0.15, 0.10)
    for i in range(200):
        for _ in range(3):  # odd requests stay below break-even long enough to stop drafting
            gate.observe_request(f"r{i}", accepted=i % 2 == 0, batch_size=4, context_tokens=100)
        assert gate.request_may_draft(f"r{i}") == (i % 2 == 0)
        gate.forget(f"r{i}")
    assert gate.requests == {} and gate.stopped == {}


def test_config_is_validated():
    with pytest.raises(ValueError, match="run_length"):
        GateConfig(run_length=1)
    with pytest.raises(ValueError, match="smoothing"):
        GateConfig(smoothing=0.0)
    with pytest.raises(ValueError, match="explore_budget"):
        GateConfig(explore_budget=0.0)
    with pytest.raises(ValueError, match="decisive"):
        GateConfig(decisive=1.0)
    with pytest.raises(ValueError, match="max_explore_every"):
        GateConfig(explore_every=128, max_explore_every=64)


def test_calibration_alternates_even_when_steps_give_no_clean_sample():
    """Steps with prompt tokens are not measured; the gate must still try plain decoding."""
    gate = SpecGate(GateConfig(run_length=2))
    modes = [gate.decide(8, 1000) for _ in range(8)]
    assert modes == [False, False, True, True, False, False, True, True]


def test_one_run_of_each_mode_settles_a_decisive_gap():
    """A speculative step of 64 requests cost 50x a plain one on CPU: a second calibration run of it costs a pass.
    A gap of ``decisive`` times or more ends calibration after one clean run of each mode; a closer one takes
    ``min_samples`` of each. Plain runs first, so a decisively losing speculative run ends at its first clean
    sample: its transition step and one verify step."""
    config = GateConfig(min_samples=4)  # two runs of each, at two clean samples per run
    decisive = simulate(SpecGate(config), 40, 10.0, 100.0)
    assert decisive[:5] == [False] * 3 + [True] * 2 and not any(decisive[5:]), decisive
    close = simulate(SpecGate(config), 40, 80.0, 100.0)
    assert close[:12] == ([False] * 3 + [True] * 3) * 2, close
    speeds = simulate(SpecGate(config), 40, 400.0, 100.0)  # either way
    assert speeds[:6] == [False] * 3 + [True] * 3 and all(speeds[3:]), speeds


def runs_of(modes: list[bool], mode: bool) -> list[int]:
    """Lengths of the runs of ``mode`` in ``modes``."""
    lengths, n = [], 0
    for m in [*modes, not mode]:
        if m == mode:
            n += 1
        elif n:
            lengths.append(n)
            n = 0
    return lengths


@pytest.mark.parametrize("spec_rate, plain_rate, loser", [(10.0, 100.0, True), (500.0, 100.0, False)])
def test_a_run_ends_at_its_first_clean_sample_when_it_loses_decisively(spec_rate, plain_rate, loser):
    """Explorations of a mode that loses by ``decisive`` times or more: its transition step and one clean
    sample, not ``run_length`` steps. A closer loser's explorations run whole."""
    config = GateConfig(run_length=4, explore_every=16, max_explore_every=32)
    modes = simulate(SpecGate(config), 600, spec_rate, plain_rate)
    explorations = runs_of(modes[8:], loser)
    assert len(explorations) >= 3 and set(explorations) == {2}, explorations
    close = simulate(SpecGate(config), 600, 50.0, 100.0)
    assert set(runs_of(close[8:], True)) == {config.run_length}


def test_a_plain_step_drops_the_drafts_before_it_unless_speculation_wins_its_regime():
    """Verifying the drafts costs a verify step of the whole batch: a loss where speculation loses, so a plain step
    there verifies none; a plain exploration where speculation wins verifies them (they commit more than they cost).
    A speculative step always verifies."""
    loses, wins = SpecGate(), SpecGate()
    simulate(loses, 200, 10.0, 100.0)
    simulate(wins, 200, 300.0, 100.0)
    assert not loses.decide(4, 2048) and not loses.keeps_drafts()
    fresh = SpecGate()
    assert not fresh.decide(4, 2048) and not fresh.keeps_drafts()  # calibrating: no winner yet
    modes = simulate(wins, 2000, 300.0, 100.0)
    assert not all(modes)  # plain explorations ran, and kept their drafts:
    wins.decide(4, 2048)
    assert wins.keeps_drafts()


def test_decisive_gaps_are_explored_less_often():
    close, decisive = SpecGate(), SpecGate()
    simulate(close, 2000, 110.0, 100.0)
    simulate(decisive, 2000, 800.0, 100.0)
    assert decisive.explorations < close.explorations / 4, (decisive.explorations, close.explorations)


def test_a_larger_batch_than_one_running_plain_starts_plain_then_calibrates():
    config = GateConfig()
    gate = SpecGate(config)
    simulate(gate, 200, 50.0, 100.0, batch=4)  # plain wins 2x at batch 4
    interval = gate.regimes[SpecGate.regime_key(4, 2048)].explore_interval(config)
    modes = simulate(gate, interval + 4 * config.run_length, 30.0, 100.0, batch=16)
    assert not any(modes[:interval]) and any(modes[interval:]), modes  # no spec step before the exploration
    assert gate.regimes[SpecGate.regime_key(16, 2048)].winner() is False
    # Where speculation wins at the smaller batch, a larger one calibrates at once: a speculative sample within its
    # first two runs.
    fresh = SpecGate(config)
    simulate(fresh, 200, 300.0, 100.0, batch=4)
    simulate(fresh, 3 * config.run_length, 300.0, 100.0, batch=16)
    assert fresh.regimes[SpecGate.regime_key(16, 2048)].spec_rate.samples >= 1
    # A smaller batch never inherits from a larger one.
    assert gate.plain_prior(2, 2048) is None and gate.plain_prior(16, 40_000) is None


@pytest.mark.parametrize("spec_rate, plain_rate", [(10.0, 100.0), (40.0, 100.0), (80.0, 100.0), (300.0, 100.0)])
def test_exploration_loses_at_most_its_budget(spec_rate, plain_rate):
    """Time spent against always running the winner, after calibration: within explore_budget (plus
    the run in flight at the end), however decisive the gap. A speculative step commits 3 tokens per
    request here, so where speculation loses by 10x one of its steps costs 30 plain ones."""
    config = GateConfig()
    gate = SpecGate(config)
    simulate(gate, 8 * config.run_length, spec_rate, plain_rate)  # calibration
    steps, batch = 12_000, 4
    modes = simulate(gate, steps, spec_rate, plain_rate, batch=batch)
    seconds = {True: batch * 3 / spec_rate, False: batch / plain_rate}  # per step of each mode
    tokens = {True: batch * 3, False: batch}
    spent = sum(seconds[m] for m in modes)
    best = max(spec_rate, plain_rate)
    ideal = sum(tokens[m] for m in modes) / best
    loss = spent / ideal - 1
    interval = gate.regimes[SpecGate.regime_key(batch, 2048)].explore_interval(config)
    assert loss <= config.explore_budget * 1.1 + config.run_length * max(seconds.values()) / ideal, (loss, interval)
    if plain_rate >= 2 * spec_rate:  # a losing speculative step is costly: explored rarely
        assert interval > 4 * config.explore_every, interval


def test_a_slow_period_on_the_winner_alone_does_not_flip_the_decision():
    """The machine slows down 2x while plain decoding runs (other work, clocks): the winner's own
    samples fall, the loser's last ones were taken at full speed. Compared back to back, speculation is
    still 13% slower, so the gate keeps decoding plain, apart from at most one exploration run."""
    config = GateConfig()
    gate = SpecGate(config)
    simulate(gate, 400, 87.0, 100.0, batch=1)
    slowed = simulate(gate, config.explore_every, 87.0 / 2, 100.0 / 2, batch=1)
    assert sum(slowed) <= config.run_length, slowed
    assert gate.regimes[SpecGate.regime_key(1, 2048)].winner() is False


def test_back_to_back_pairs_set_the_winner_once_they_exist():
    gate = SpecGate(GateConfig(run_length=2, pair_samples=2))
    regime = gate.regime(1, 100)
    for spec, rate in ((True, 90.0), (True, 90.0), (False, 100.0), (False, 100.0)):
        gate.observe(speculative=spec, batch_size=1, context_tokens=100, committed_tokens=1, seconds=1 / rate)
    assert regime.advantage.samples == 1 and regime.speedup() == pytest.approx(0.9)
    # A plain run sampled much later (a slow period) moves the averages, not the pairs' verdict.
    for _ in range(6):
        gate.observe(speculative=False, batch_size=1, context_tokens=100, committed_tokens=1, seconds=1 / 40.0)
    assert regime.plain_rate.value < regime.spec_rate.value and regime.winner() is False


def test_a_batch_whose_requests_all_stopped_drafting_runs_plain_until_one_may_draft():
    """Drafting with every request's drafts discarded costs a speculative step and commits a plain one.
    Measured before this rule (trained pair, one request): 102 of 177 steps of a pass ran so."""
    gate = SpecGate(GateConfig(patience=3, retry_after=20))
    simulate(gate, 200, 300.0, 100.0, batch=1)  # speculation wins this regime
    before = dict(gate.decisions)
    assert not any(gate.decide(1, 2048, drafting=False) for _ in range(50)) and not gate.speculating
    assert gate.decisions["plain"] - before["plain"] == 50 and gate.decisions["spec"] == before["spec"]
    assert sum(gate.decide(1, 2048) for _ in range(50)) >= 45  # speculation resumes when a request may draft


def test_steps_with_prompt_tokens_are_a_regime_of_their_own():
    """Between prompts speculation wins; in steps that also carry a prompt chunk it loses. The gate learns both."""
    gate = SpecGate(GateConfig())
    for _ in range(300):
        for prompt, spec_rate in ((False, 300.0), (True, 50.0)):
            spec = gate.decide(4, 2048, prompt=prompt)
            rate = spec_rate if spec else 100.0
            gate.observe(speculative=spec, batch_size=4, context_tokens=2048, committed_tokens=4, seconds=4 / rate,
                         prompt=prompt)
    assert gate.regimes[SpecGate.regime_key(4, 2048)].winner() is True
    assert gate.regimes[SpecGate.regime_key(4, 2048, prompt=True)].winner() is False
    assert "+prompt" in gate.summary()


def test_a_prompt_step_starts_plain_where_the_same_batch_without_prompts_runs_plain():
    config = GateConfig()
    gate = SpecGate(config)
    simulate(gate, 200, 50.0, 100.0, batch=8)  # between prompts plain wins 2x at batch 8
    interval = gate.regimes[SpecGate.regime_key(8, 2048)].explore_interval(config)
    assert gate.plain_prior(8, 2048, prompt=True) == interval == gate.plain_prior(16, 2048, prompt=True)
    modes = [gate.decide(8, 2048, prompt=True) for _ in range(interval)]
    assert not any(modes)  # no costly calibration step before its first exploration
    # The prior runs one way only: a step without prompts never inherits from one with them, nor from a
    # larger batch, nor across contexts.
    other = SpecGate(config)
    simulate(other, 200, 50.0, 100.0, batch=8, prompt=True)
    assert other.plain_prior(8, 2048) is None and other.plain_prior(4, 2048, prompt=True) is None
    assert gate.plain_prior(4, 2048, prompt=True) is None and gate.plain_prior(8, 40_000, prompt=True) is None


def test_a_prompt_regime_seen_one_step_at_a_time_waits_for_its_exploration_after_a_try_without_a_sample():
    """The step that admits a prompt into a full batch is a regime visited one step at a time: a speculative
    try there yields no clean sample (its drafts are verified in the next step, another regime). Where the
    same batch without prompts runs plain, the next try waits for that regime's exploration interval; before,
    it came on the next visit but one, and each cost a verify step of the whole batch."""
    config = GateConfig()
    gate = SpecGate(config)
    assert not gate.decide(4, 2048, prompt=True)  # nothing measured anywhere yet: calibration starts plain
    # Without prompts plain wins 3.3x (not decisively: its explorations run whole). Whole runs between the visits
    # keep each visit a decision of its own (a prompt visit's run ends at the next step, which has none).
    simulate(gate, 100 * config.run_length, 30.0, 100.0)
    interval = gate.regimes[SpecGate.regime_key(4, 2048)].explore_interval(config)
    visits = []
    for _ in range(interval // 2):
        visits.append(gate.decide(4, 2048, prompt=True))
        simulate(gate, 2 * config.run_length, 30.0, 100.0)
    assert gate._hold == 0 and len(visits) >= 32 and not any(visits), visits


def test_a_step_with_nothing_to_draft_makes_the_rest_of_its_run_plain():
    """A prefill-only step (no running request may draft yet) vetoes calibration's speculation. Before, the
    veto covered that step alone and the next one drafted, so a batch of 64 then verified its drafts (2 s on
    CPU, trained pair) outside any calibration run."""
    config = GateConfig(run_length=3)
    gate = SpecGate(config)
    assert not gate.decide(64, 0, drafting=False, prompt=True)
    assert [gate.decide(64, 0, prompt=True) for _ in range(config.run_length - 1)] == [False, False]
    assert gate.decide(64, 0, prompt=True)  # a new run: calibration's speculation, with something to draft


def test_a_run_decided_for_prompt_steps_ends_at_the_first_step_without_them():
    """The step that admits a prompt is visited alone; the decode steps after it are decided by their own regime.
    Before, they held the prompt step's decision: where speculation wins, a plain admission (nothing to draft, or
    calibration's plain try) ran two decode steps plain (of about 13 per 192-token request on the always-right
    pair)."""
    config = GateConfig(run_length=3)
    gate = SpecGate(config)
    simulate(gate, 60, 300.0, 100.0)  # without prompts speculation wins 3x
    assert gate.regimes[SpecGate.regime_key(4, 2048)].winner() is True
    assert not gate.decide(4, 2048, drafting=False, prompt=True)  # nothing to draft at the admission
    assert gate.decide(4, 2048)  # the next step, without prompts, speculates at once
    # Steps with prompt tokens in a row keep their run, as any regime's steps do.
    assert [gate.decide(4, 2048) for _ in range(config.run_length - 1)] == [True, True]  # that run's end
    assert not gate.decide(4, 2048, drafting=False, prompt=True)
    assert [gate.decide(4, 2048, prompt=True) for _ in range(config.run_length - 1)] == [False, False]
    assert gate.decide(4, 2048, prompt=True)  # a new run: the prompt step speculates (``spec_prior``)


def test_a_prompt_step_speculates_where_the_same_batch_without_prompts_speculates():
    """Until its own regime has a speculative sample: visited one step at a time, it never has one."""
    config = GateConfig(run_length=3)
    gate = SpecGate(config)
    assert not gate.decide(4, 2048, prompt=True)  # nothing measured: calibration, plain first
    simulate(gate, 60, 300.0, 100.0)  # without prompts speculation wins 3x
    assert gate.spec_prior(4, 2048) and gate.decide(4, 2048, prompt=True)
    simulate(gate, 2 * config.run_length, 300.0, 100.0)  # decode steps in runs of their own
    assert gate.decide(4, 2048, prompt=True)  # the next admission, still without a speculative sample
    # Only the same batch and context: not a smaller or larger batch, nor another context.
    assert not gate.spec_prior(8, 2048) and not gate.spec_prior(2, 2048) and not gate.spec_prior(4, 40_000)
    # Once the regime has samples of its own it calibrates as any regime does (here speculation loses there).
    simulate(gate, 60, 50.0, 100.0, prompt=True)
    assert gate.regimes[SpecGate.regime_key(4, 2048, prompt=True)].winner() is False


def test_a_losing_speculation_is_rechecked_by_probes_between_exploration_runs():
    """Where plain wins, a re-check is one drafting step whose drafts are not verified (a probe), while its predicted
    rate stays below ``probe_explores_at`` of plain's; an exploration run still comes every ``max_explore_every``
    steps. Without probes, each re-check is an exploration run."""
    config = GateConfig(explore_every=16, max_explore_every=1024, explore_budget=0.1)  # re-checks every 180 steps
    gate = SpecGate(config)
    simulate(gate, 40, 40.0, 100.0)  # calibration: speculation commits 0.4x
    explorations, probes = gate.explorations, gate.probes
    modes = simulate(gate, 900, 40.0, 100.0)
    assert gate.probes - probes >= 4 and gate.explorations == explorations
    assert set(runs_of(modes, True)) == {1}  # each a single drafting step
    assert gate.regimes[SpecGate.regime_key(4, 2048)].probe_speedup == pytest.approx(0.4)
    simulate(gate, 300, 40.0, 100.0)
    assert gate.explorations > explorations  # the verdict is re-measured now and then
    off = SpecGate(GateConfig(explore_every=16, max_explore_every=1024, explore_budget=0.1, probes=False))
    simulate(off, 940, 40.0, 100.0)
    assert off.probes == 0 and off.explorations >= 4


def test_a_probe_that_predicts_speculation_pays_runs_an_exploration():
    """Acceptance rises (the text turned predictable): the next probe's drafts match what the requests commit, its
    prediction passes ``probe_explores_at``, and the exploration run that follows measures speculation winning."""
    config = GateConfig(explore_every=16, explore_budget=0.1)
    gate = SpecGate(config)
    # A speculative step costs 3 plain ones: at 1 token per request (nothing accepted) it commits a third as fast.
    simulate(gate, 200, 100.0 / 3, 100.0, spec_tokens=1)
    regime = gate.regimes[SpecGate.regime_key(4, 2048)]
    assert regime.winner() is False and gate.probes >= 1 and regime.probe_speedup == pytest.approx(1 / 3)
    explorations = gate.explorations
    modes = simulate(gate, 400, 400.0 / 3, 100.0, spec_tokens=4)  # the same step cost, 4 tokens per request
    assert gate.explorations > explorations and regime.winner() is True
    assert sum(modes[-100:]) >= 80  # speculation runs, bar plain explorations


def test_probes_need_measured_step_costs_and_no_prompt_tokens():
    gate = SpecGate(GateConfig(explore_every=16, explore_budget=0.1))
    simulate(gate, 600, 40.0, 100.0, prompt=True)
    assert gate.probes == 0 and gate.explorations >= 1
    with pytest.raises(ValueError, match="probe_explores_at"):
        GateConfig(probe_explores_at=0.0)
    assert SpecGate().regime(4, 2048).predicted_speedup(1.0) is None


def test_plain_steps_ahead_run_plain_and_leave_the_recheck_where_deciding_them_would():
    """After a plain decision in a regime plain wins, the steps up to the clean samples its re-check needs run plain
    whatever they observe: skipping them (no decision, no observation) leaves the gate where deciding them would."""
    import copy

    config = GateConfig(explore_every=16, explore_budget=0.1)
    gate = SpecGate(config)
    simulate(gate, 100, 40.0, 100.0)  # plain wins 2.5x
    while gate.decide(4, 2048) or gate.plain_steps_ahead() == 0:
        pass
    ahead = gate.plain_steps_ahead()
    regime = gate.regimes[SpecGate.regime_key(4, 2048)]
    margin = config.pair_samples + config.run_length
    assert ahead == regime.explore_interval(config) - (regime.steps - regime.last_explore) - margin > 0
    skipping = copy.deepcopy(gate)
    assert not any(gate.decide(4, 2048) for _ in range(ahead))
    for _ in range(ahead):
        skipping.skip_plain_step()
    assert skipping.decisions == gate.decisions and skipping.step == gate.step
    assert simulate(skipping, 300, 40.0, 100.0) == simulate(gate, 300, 40.0, 100.0)
    gate.decide(4, 3068)  # the same regime (contexts 2,048-3,071), 1,020 tokens past its 1,024
    assert gate.plain_steps_ahead() <= 3  # short of the next 1,024 tokens of context: maybe another regime
    assert gate.decide(4, 2048, prompt=True) is False and gate.plain_steps_ahead() == 0  # prompt steps: none
    fresh = SpecGate(config)
    simulate(fresh, 100, 300.0, 100.0)  # speculation wins
    fresh.decide(4, 2048)
    assert fresh.plain_steps_ahead() == 0


def test_plain_steps_ahead_cover_a_regime_that_runs_plain_on_an_easier_ones_verdict():
    """A larger batch than one plain wins runs plain until its first exploration (``plain_prior``); skipping those
    steps leaves its calibration where deciding them would."""
    import copy

    config = GateConfig(explore_every=16, explore_budget=0.1)
    gate = SpecGate(config)
    simulate(gate, 200, 40.0, 100.0, batch=4)  # plain wins 2.5x at batch 4
    assert not gate.decide(16, 2048)  # batch 16: no speculative sample, plain on batch 4's verdict
    ahead = gate.plain_steps_ahead()
    prior = gate.plain_prior(16, 2048)
    assert ahead == prior + 1 - 1 - (config.pair_samples + config.run_length) > 0
    skipping = copy.deepcopy(gate)
    assert not any(gate.decide(16, 2048) for _ in range(ahead))
    for _ in range(ahead):
        skipping.skip_plain_step()
    assert simulate(skipping, 300, 30.0, 100.0, batch=16) == simulate(gate, 300, 30.0, 100.0, batch=16)
    assert any(simulate(copy.deepcopy(gate), 300, 30.0, 100.0, batch=16))  # the exploration still comes


def test_a_declined_request_never_drafts_until_forgotten():
    gate = calibrated_gate(0.10, 0.15)
    gate.decline("quiet")
    assert gate.holds_back and not gate.request_may_draft("quiet") and gate.request_may_draft("other")
    for _ in range(3 * gate.config.retry_after):  # no retry brings it back, unlike a request the gate stopped
        gate.decide(4, 100)
    assert not gate.request_may_draft("quiet")
    gate.forget("quiet")
    assert not gate.holds_back and gate.request_may_draft("quiet")
