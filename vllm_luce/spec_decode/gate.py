"""The self-calibrating DFlash gate (pure: no vLLM import).

Speculation pays when it commits more tokens per second than plain decoding. Which one does
depends on batch size, context length, the drafter, the text and the hardware, so the gate does
not guess: it measures both. Per regime (batch size and context length bucketed to powers of
two, and whether the step also carries prompt tokens) it keeps a smoothed rate of committed tokens
per second for speculative steps and for plain steps, runs whichever is faster, and still runs the
other one now and then so a stale estimate cannot lock a regime into the wrong mode.

Exploring costs time, so a budget sets its interval. A run of the losing mode costs ``run_length``
of its steps at the losing rate, and one more: the step after the run still does the loser's work
(it verifies the run's last drafts), as does the run's first one (it writes the held drafter
context). The interval is the number of winning steps over which that loss stays within
``explore_budget`` of the time, at least ``explore_every`` and at most ``max_explore_every`` steps.
Two close modes are compared every ``explore_every`` steps. A mode that loses by 4x, one of its steps
costing six of the other's (the always-wrong drafter at batch 16 on a 2-core CPU), is re-checked about
once in 1,800 steps (4 x 6 x 0.75 / 0.01). The budget, 1%, is the best of 0.5, 1 and 2% on
``benchmarks/dflash_gate_sim.py``: 2% lost up to 1.2 points more where one mode clearly wins, 0.5% was
slowest to notice text that turned speculation into the winner.

A regime without samples of both modes alternates runs, plain first, until it has ``min_samples`` of
each, or one of each that differ by ``decisive`` times or more, far beyond measurement noise (one
speculative step of 64 requests on the trained pair cost 2-3.6 s on CPU against 45 ms for a plain one,
so a second calibration run there cost as much as a whole pass), except a larger batch than one that
already runs plain at its context, or a step with prompt tokens where the same batch without them runs
plain: until it has a speculative sample it runs plain, and tries speculation once per exploration
interval of that easier regime (``plain_prior``); and a step with prompt tokens where the same batch without
them speculates runs speculative until its regime has a speculative sample (``spec_prior``). A regime visited
one step at a time (the steps that admit a prompt) never yields a clean speculative sample, and retrying it on
each visit cost a verify step of the whole batch each time. A decision holds for ``run_length`` steps:
drafts made in one step are verified in the next, so the first step of a run is a transition (the binding
reports it as neither mode) and the rest are clean samples. A run decided for a step with prompt tokens ends at the
first step without them, which its own regime decides: the step that admits prompts is usually visited
alone, and holding its decision (plain where nothing could draft yet) ran ``run_length - 1`` decode steps
plain where speculation wins them. A run ends early when its first clean sample is
``decisive`` times slower than the other mode's rate in its regime: plain first, a speculative
calibration or exploration that loses by that much costs one verify step, not ``run_length``.

Where speculation's measured verdict is below ``probe_explores_at``, the re-check is a probe rather than an
exploration run (``probe_suits``): one step drafts, the next (plain) drops its drafts, and the binding
compares them with the tokens each request goes on to commit. That matched length is the acceptance
speculation would get; the measured verdict, scaled by it against the acceptance it was measured at,
predicts speculation's rate (``observe_probe``), and only a prediction of ``probe_explores_at`` or more runs
a real exploration. Speculation loses where acceptance is too low for its verify steps, and a probe
measures exactly that at the cost of one drafting step, without the verify steps.

A plain step drops the drafts of the step before (verifies none of them) unless speculation wins its
regime (``keeps_drafts``): verifying them costs a verify step of the whole batch, a loss wherever
speculation does. Where it wins, the plain run is an exploration and the drafts commit more than they
cost. Measured on CPU under the load test (trained pair, 32 streams), speculation committed 0.07x plain's
tokens per second where almost every step ran: the verify step after its calibration run was pure loss.

Which mode wins is judged from runs of the two modes measured back to back in a regime: the last
clean samples before a switch against the first ones after it. Machine speed drifts (other work,
clocks, cache and memory pressure) for seconds at a time, and a moving average per mode compares the
loser's samples, taken in one exploration, with the winner's, taken since: a slow period that falls on
the winner alone makes it look like the loser. A back-to-back pair sees both modes at one speed, so
the gate keeps a smoothed log ratio of those pairs (``Regime.advantage``) and uses the per-mode
averages only until the first pair, and for step costs.

Per request it keeps the smoothed number of accepted draft tokens per verify step. Verifying a
request's drafts costs its share of the extra step time, ``t_spec / t_plain - 1`` committed-token
equivalents (both times measured by the same regime), so a request whose acceptance stays below
that break-even for ``patience`` verify steps stops drafting; it is re-tried after
``retry_after`` steps, so text that becomes predictable again is speculated again.

Both modes are lossless: a decision changes speed, never output.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vllm_luce.spec_decode.regime import Average, Regime, bucket


@dataclass(frozen=True)
class GateConfig:
    explore_every: int = 64  # fewest steps between runs of the mode currently losing, per regime
    max_explore_every: int = 4096  # most steps between them (a regime is re-checked at least this often)
    explore_budget: float = 0.01  # share of time exploration may lose against always running the winner
    run_length: int = 3  # steps a decision holds (the first is a transition)
    min_samples: int = 2  # measured steps of each mode before a regime decides
    smoothing: float = 0.25  # weight of a new sample in the moving averages
    patience: int = 4  # verify steps below break-even before a request stops drafting
    retry_after: int = 64  # steps a stopped request waits before drafting again
    pair_samples: int = 8  # clean samples of each run end compared across a switch of mode
    decisive: float = 4.0  # speed ratio at which one sample of each mode ends a regime's calibration
    probes: bool = True  # re-check a losing speculation by probing (one drafting step, its drafts not verified)
    probe_explores_at: float = 0.8  # predicted speculative over plain rate at which a probe calls an exploration

    def __post_init__(self):
        if self.run_length < 2 or not self.run_length < self.explore_every <= self.max_explore_every or min(
                self.min_samples, self.patience, self.retry_after, self.pair_samples) < 1:
            raise ValueError(f"GateConfig needs run_length >= 2, run_length < explore_every <= max_explore_every "
                             f"and the counts >= 1, got {self}")
        if not 0.0 < self.smoothing <= 1.0:
            raise ValueError(f"GateConfig.smoothing must be in (0, 1], got {self.smoothing}")
        if not self.decisive > 1.0:
            raise ValueError(f"GateConfig.decisive must be > 1, got {self.decisive}")
        if not 0.0 < self.explore_budget < 1.0:
            raise ValueError(f"GateConfig.explore_budget must be in (0, 1), got {self.explore_budget}")
        if not self.probe_explores_at > 0.0:
            raise ValueError(f"GateConfig.probe_explores_at must be > 0, got {self.probe_explores_at}")


@dataclass
class RequestState:
    accepted: Average = field(default_factory=Average)
    low_streak: int = 0


class SpecGate:
    def __init__(self, config: GateConfig = GateConfig()):
        self.config = config
        self.regimes: dict[tuple[int, int], Regime] = {}
        self.requests: dict[str, RequestState] = {}
        self.stopped: dict[str, int] = {}  # requests not drafting -> the gate step they stopped at
        self.declined: set[str] = set()  # requests that asked for no speculation (vllm_xargs luce_dflash off)
        self.step = 0
        self.decisions = {"spec": 0, "plain": 0}
        self.explorations = 0
        self.probes = 0  # probes run (``probing``)
        self.probing = False  # whether the latest decision is a probe: the binding compares its drafts, unverified
        self._mode = True  # the decision of the run in progress
        self._hold = 0
        self._run_regime: Regime | None = None  # where the run in progress was decided
        self._run_prompt = False  # whether it was decided for a step with prompt tokens
        self._regime: Regime | None = None  # where the latest step was decided
        self._decided: tuple = ()  # the latest decision's batch, context and prompt flag
        self._latest = True  # what the latest step ran
        self._samples = 0  # clean samples observed, all regimes: the clock of back-to-back pairs
        self._asked: tuple | None = None  # the latest regime asked for: batch, context // 1024, prompt
        self._asked_regime: Regime | None = None

    @staticmethod
    def regime_key(batch_size: int, context_tokens: int, prompt: bool = False) -> tuple[int, int, bool]:
        return bucket(batch_size), bucket(context_tokens // 1024), prompt

    def regime(self, batch_size: int, context_tokens: int, prompt: bool = False) -> Regime:
        seen = (batch_size, context_tokens >> 10, prompt)  # decide and observe ask for the same regime each step
        if seen == self._asked:
            return self._asked_regime
        key = self.regime_key(batch_size, context_tokens, prompt)
        r = self.regimes.get(key)
        if r is None:  # not setdefault: building a Regime costs more than the rest of a decision
            r = self.regimes[key] = Regime()
        self._asked, self._asked_regime = seen, r
        return r

    # ------------------------------------------------------------------ batch decision

    def decide(self, batch_size: int, context_tokens: int, drafting=True, prompt: bool = False) -> bool:
        """Speculate on the next step of a batch of this size and mean context? ``drafting``: whether any
        request of the batch may draft (``request_may_draft``), or a function that says so, asked only when
        the gate would speculate. With none, a speculative step would draft for nothing and verify nothing,
        so the step runs plain, and so does the rest of its run: a prefill-only step, where no request may
        draft yet, must not pass a calibration's speculation on to the next step (a batch of 64 then
        verified its drafts in 2 s on CPU). ``prompt``: the step will also carry prompt tokens (a regime of
        its own, see ``observe``)."""
        choice = self._choose(batch_size, context_tokens, prompt, drafting if callable(drafting) else lambda: drafting)
        self.decisions["spec" if choice else "plain"] += 1
        self._latest = choice
        return choice

    def _choose(self, batch_size: int, context_tokens: int, prompt: bool, may_draft) -> bool:
        self.step += 1
        self.probing = probe = False
        self._decided = (batch_size, context_tokens, prompt)
        r = self._regime = self.regime(batch_size, context_tokens, prompt)
        r.steps += 1
        if self._run_prompt and not prompt:
            self._hold = 0  # the prompt steps' run ends with them
        if self._hold > 0:
            self._hold -= 1
            if self._mode and not may_draft():
                self._mode = False  # nothing to draft: the run goes on plain
            return self._mode
        if not r.calibrated(self.config):
            prior = self.plain_prior(batch_size, context_tokens, prompt) if r.spec_rate.samples == 0 else None
            if prior is not None and r.steps - r.last_explore <= prior:
                choice = False  # an easier regime runs plain here: so does this one, until an exploration
            elif prior is None and prompt and r.spec_rate.samples == 0 and self.spec_prior(batch_size, context_tokens):
                choice = True  # the same batch without prompt tokens speculates: so does this one, until a sample
            else:
                if prior is not None:  # that exploration: calibrate from here, the plain runs counted as one
                    r.last_explore = r.steps
                    r.runs[True], r.runs[False] = 0, 1
                    self.explorations += 1
                # Calibrating: alternate runs (even if a run yielded no clean sample), plain first, so that
                # speculation's first clean sample can end a decisively losing run.
                choice = r.runs[True] < r.runs[False]
        else:
            choice = bool(r.winner())
            since = r.steps - r.last_explore  # the interval is explore_every at least: worked out only past that
            if r.explore_due or since >= self.config.explore_every and since >= r.explore_interval(self.config):
                r.last_explore = r.steps
                if not choice and self.probe_suits(r, prompt):
                    choice = probe = True  # one drafting step; its drafts are compared, not verified
                else:
                    choice = not choice
                    r.explore_due, r.last_real_explore = False, r.steps
                    self.explorations += 1
        if choice and not may_draft():
            choice = False  # nothing to draft: a plain run
        r.runs[choice] += 1
        self.probing = probe and choice
        self.probes += self.probing
        hold = 0 if self.probing else self.config.run_length - 1  # after a probe, the next step decides afresh
        self._mode, self._hold, self._run_regime, self._run_prompt = choice, hold, r, prompt
        return choice

    def probe_suits(self, r: Regime, prompt: bool) -> bool:
        """Whether a regime where plain decoding wins re-checks speculation with a probe instead of an exploration
        run: a step that drafts but verifies nothing (the next, plain, step drops the drafts), whose drafts the
        binding compares with the tokens each request then commits (``observe_probe``). Speculation loses there
        whenever acceptance is too low for its verify steps' cost, so the acceptance it would get, read off the
        probe, predicts its rate (``Regime.predicted_speedup``); only a prediction of ``probe_explores_at`` or
        more runs the exploration. A probe costs a drafting step, an exploration that step and the verify steps
        after it (on the always-wrong pair at batch 1 on CPU: 7.1 and 3.7 ms twice against 1.55 ms plain steps).
        Only where speculation's measured verdict is itself below that (a closer loser gets its exploration runs,
        which a probe would only precede), not for steps with prompt tokens (their regime is visited a step at a
        time), and an exploration still runs at least every ``max_explore_every`` steps, to re-measure the verdict
        the prediction scales."""
        speedup = r.speedup()
        return (self.config.probes and not prompt and not r.explore_due and r.spec_tokens.samples > 0
                and speedup is not None and speedup < self.config.probe_explores_at
                and r.steps - r.last_real_explore < self.config.max_explore_every)

    def observe_probe(self, batch_size: int, context_tokens: int, accepted: float) -> None:
        """A probe's outcome: the mean number of its drafts, per request, that matched the tokens the request went on
        to commit (the accepted length greedy verification would have given; for a sampled request, matching the
        sampled token has the probability with which vLLM's verification accepts a draft without probabilities).
        Where that predicts speculation at ``probe_explores_at`` or more of plain's rate, the regime explores at its
        next decision."""
        r = self.regimes.get(self.regime_key(batch_size, context_tokens))
        predicted = None if r is None else r.predicted_speedup(accepted)
        if predicted is None:
            return
        r.probe_speedup = predicted
        if predicted >= self.config.probe_explores_at:
            r.explore_due = True

    def plain_steps_ahead(self) -> int:
        """Steps after the one just decided that run plain whatever they would observe, while the step's regime stays
        the same (the binding checks its batch and prompt tokens; the decision's context, the batch's mean, grows by
        one a decode step, and the count stops short of its next 1,024): the latest decision was plain, not a prompt step's,
        in a measured regime that plain wins or one that runs plain on an easier regime's verdict (``plain_prior``:
        each new batch-size bucket of such a load), and its re-check is further off than the clean samples that come
        just before it (``pair_samples`` plain samples for the back-to-back comparison, and a run). The binding
        neither decides nor observes those steps (``skip_plain_step``): in steady plain decoding the decision and the
        observation were about 22 us of a 1.8 ms step on CPU (always-wrong pair at batch 4)."""
        r = self._regime
        if self._latest or r is None or self._decided[2] or r.explore_due:
            return 0
        if r.calibrated(self.config):
            if r.winner() is not False:
                return 0
            recheck = r.explore_interval(self.config)  # steps since the last re-check at which the next one runs
        else:  # running plain on an easier regime's verdict (plain_prior) until its first exploration
            prior = None if r.spec_rate.samples else self.plain_prior(*self._decided)
            if prior is None:
                return 0
            recheck = prior + 1
        ahead = recheck - (r.steps - r.last_explore) - (self.config.pair_samples + self.config.run_length)
        return max(0, min(ahead, 1023 - self._decided[1] % 1024))

    def skip_plain_step(self) -> None:
        """One of ``plain_steps_ahead``'s steps, counted as the plain decision it is, in the same regime; nothing is
        observed."""
        self.step += 1
        r = self._regime
        r.steps += 1
        if self._hold > 0:  # as in _choose: a run's steps, then a new plain run
            self._hold -= 1
        else:
            r.runs[False] += 1
            self._hold = self.config.run_length - 1
        self.decisions["plain"] += 1

    def keeps_drafts(self) -> bool:
        """Whether the step just decided verifies the drafts of the step before: a speculative step does, a
        plain one only where speculation wins its regime (a plain exploration). Elsewhere the binding drops
        them: their verification would cost a verify step of the whole batch for what a plain step commits."""
        return self._latest or (self._regime is not None and self._regime.winner() is True)

    def plain_prior(self, batch_size: int, context_tokens: int, prompt: bool = False) -> int | None:
        """Steps a regime without a speculative sample runs plain between calibration tries, when a measured
        regime that speculation suits at least as well runs plain at its context: a smaller batch (verifying
        scales with the batch, acceptance does not), or, for a step with prompt tokens, the same or a smaller
        batch without them (the prompt chunk is work both modes share, and verify rows take its token
        budget). Calibrating from scratch would spend its costliest steps on a known loser. The exploration
        interval of the largest such batch; None when there is none."""
        b, c, p = self.regime_key(batch_size, context_tokens, prompt)
        easier = [((bb, pp), r) for (bb, cc, pp), r in self.regimes.items()
                  if cc == c and (bb < b and pp == p or p and not pp and bb <= b) and r.winner() is False]
        if not easier:
            return None
        _, r = max(easier, key=lambda item: item[0])
        return r.explore_interval(self.config)

    def spec_prior(self, batch_size: int, context_tokens: int) -> bool:
        """Whether a step with prompt tokens whose regime has no speculative sample speculates: where the same
        batch at its context without them speculates (its winner). The step that admits prompts is usually
        visited alone and never yields a speculative sample (its drafts are verified in the next step, another
        regime), so calibrating it alternated plain and speculative admissions, and after each plain one the
        first decode step had nothing to verify. With the end of a prompt step's run at the next step without
        prompts, the gated engine took 63 steps where it took 72-73 (the always-right pair, a warm-up and four
        passes of 192-token requests per concurrency). The counterpart of ``plain_prior``, for the same batch."""
        r = self.regimes.get(self.regime_key(batch_size, context_tokens))
        return r is not None and r.winner() is True

    def observe(self, *, speculative: bool, batch_size: int, context_tokens: int, committed_tokens: int,
                seconds: float, prompt: bool = False) -> None:
        """One finished step: its mode, its batch, the tokens it committed and its wall time. A step that also
        carried prompt tokens (``prompt``) counts them as committed: it is measured in a regime of its own,
        where both modes are charged for the same kind of work. There the verify rows' tokens compete with
        the prompt chunk for the step's token budget and compute, so speculation can lose where it wins
        between prompts."""
        if seconds <= 0 or committed_tokens <= 0 or batch_size <= 0:
            return
        r = self.regime(batch_size, context_tokens, prompt)
        w = self.config.smoothing
        rate, step_s = (r.spec_rate, r.spec_step_s) if speculative else (r.plain_rate, r.plain_step_s)
        rate.add(committed_tokens / seconds, w)
        step_s.add(seconds / batch_size, w)  # per request, so regimes of one bucket compare
        if speculative:
            r.spec_tokens.add(committed_tokens / batch_size, w)
        self._samples += 1
        r.track(speculative, committed_tokens / seconds, self._samples, self.config)
        other = r.plain_rate if speculative else r.spec_rate
        if (self._hold > 0 and r is self._run_regime and speculative == self._mode and other.samples
                and committed_tokens / seconds * self.config.decisive <= other.value):
            self._hold = 0  # the run's mode loses decisively here: the next step decides afresh

    # ------------------------------------------------------------------ per request

    def decline(self, request_id: str) -> None:
        """The request asked for no speculation: it never uses drafts, whatever the batch decides."""
        self.declined.add(request_id)

    @property
    def holds_back(self) -> bool:
        """Whether some request may not use its drafts (stopped by the gate, or declined)."""
        return bool(self.stopped or self.declined)

    def request_may_draft(self, request_id: str) -> bool:
        if request_id in self.declined:
            return False
        stopped_at = self.stopped.get(request_id)
        if stopped_at is None:
            return True
        if self.step - stopped_at >= self.config.retry_after:
            del self.stopped[request_id]
            self.requests[request_id].low_streak = 0
            return True
        return False

    def observe_request(self, request_id: str, accepted: int, batch_size: int, context_tokens: int,
                        prompt: bool = False) -> None:
        """A verify step of one request: ``accepted`` of its drafts were accepted."""
        state = self.requests.setdefault(request_id, RequestState())
        state.accepted.add(float(accepted), self.config.smoothing)
        threshold = self.regime(batch_size, context_tokens, prompt).break_even()
        if threshold is None:
            return
        state.low_streak = state.low_streak + 1 if state.accepted.value < threshold else 0
        if state.low_streak >= self.config.patience and request_id not in self.stopped:
            self.stopped[request_id] = self.step

    def forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.stopped.pop(request_id, None)
        self.declined.discard(request_id)

    # ------------------------------------------------------------------ reporting

    @property
    def speculating(self) -> bool:
        """Whether the latest step speculates."""
        return self._latest

    def stopped_requests(self) -> int:
        return len(self.stopped)

    def summary(self) -> str:
        parts = []
        for (b, c, p), r in sorted(self.regimes.items()):
            w = r.winner()
            mode = "calibrating" if w is None else ("spec" if w else "plain")
            paired = f", back to back x{math.exp(r.advantage.value):.2f}" if r.advantage.samples else ""
            parts.append(f"batch<={b} ctx<={c}K{' +prompt' if p else ''}: spec {r.spec_rate.value:.1f} tok/s vs "
                         f"plain {r.plain_rate.value:.1f} tok/s{paired} -> {mode}")
        return (f"gate: {self.decisions['spec']} spec / {self.decisions['plain']} plain steps, "
                f"{self.explorations} explorations, {self.probes} probes, "
                f"{self.stopped_requests()} requests not drafting; "
                + ("; ".join(parts) or "no regimes yet"))
