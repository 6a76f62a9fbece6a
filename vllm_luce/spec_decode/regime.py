"""One regime's measurements for the DFlash gate (pure: no vLLM import): smoothed rates and step costs of
speculative and plain steps, the runs measured back to back, and what follows from them (the verdict, the
exploration interval, a probe's prediction, the per-request break-even). ``gate.py`` decides from these."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_luce.spec_decode.gate import GateConfig


def bucket(n: int) -> int:
    """0 for n <= 0, else the power of two at or above n: regimes 1, 2, 4, 8, ..."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


@dataclass
class Average:
    value: float = 0.0
    samples: int = 0

    def add(self, x: float, weight: float) -> None:
        self.value = x if self.samples == 0 else self.value + weight * (x - self.value)
        self.samples += 1


@dataclass
class Run:
    """Consecutive clean samples of one mode in one regime (committed tokens / second): its first and
    last ``pair_samples`` are kept, the ends that border the other mode's runs."""

    speculative: bool
    rates: list = field(default_factory=list)
    last_seq: int = 0  # the gate's sample count at its latest sample
    compared: bool = False  # with the run before it


@dataclass
class Regime:
    spec_rate: Average = field(default_factory=Average)  # committed tokens / second
    plain_rate: Average = field(default_factory=Average)
    spec_step_s: Average = field(default_factory=Average)  # seconds per step
    plain_step_s: Average = field(default_factory=Average)
    advantage: Average = field(default_factory=Average)  # log(spec rate / plain rate), back-to-back runs
    spec_tokens: Average = field(default_factory=Average)  # committed tokens per request per speculative step
    steps: int = 0
    last_explore: int = 0
    runs: dict = field(default_factory=lambda: {True: 0, False: 0})  # runs started, by mode
    run: Run | None = None  # the run being sampled
    previous: Run | None = None  # the run of the other mode just before it
    explore_due: bool = False  # a probe predicted that speculation may pay: explore at the next decision
    last_real_explore: int = 0  # steps at the latest exploration run (probes stand in for those between)
    probe_speedup: float | None = None  # the latest probe's predicted speculative over plain rate

    def speedup(self) -> float | None:
        """Speculative over plain committed-token rate: from back-to-back runs once a pair exists, before
        that from the two averages; None before both modes are measured."""
        if not (self.spec_rate.samples and self.plain_rate.samples):
            return None
        if self.advantage.samples:
            return math.exp(self.advantage.value)
        return self.spec_rate.value / self.plain_rate.value if self.plain_rate.value > 0 else math.inf

    def calibrated(self, config: GateConfig) -> bool:
        """``min_samples`` of each mode, or one of each and a ratio of ``decisive`` or more either way."""
        spec_n, plain_n = self.spec_rate.samples, self.plain_rate.samples
        if min(spec_n, plain_n) >= config.min_samples:
            return True
        speedup = self.speedup()
        return speedup is not None and not 1.0 / config.decisive < speedup < config.decisive

    def winner(self) -> bool | None:
        """True if speculation is faster, False if plain is, None before both are measured."""
        speedup = self.speedup()
        return None if speedup is None else speedup >= 1.0

    def track(self, speculative: bool, rate: float, seq: int, config: GateConfig) -> None:
        """A clean sample joins its run. A run that follows the other mode's within ``run_length`` samples
        is compared with it once it has ``pair_samples`` samples, or when it ends with fewer (an
        exploration's run has ``run_length - 1``): its first samples against the other's last."""
        k, run = config.pair_samples, self.run
        if run is None or run.speculative != speculative or seq - run.last_seq > config.run_length:
            if run is not None:
                self._compare(run, k, config.smoothing)
            adjacent = run is not None and run.speculative != speculative and seq - run.last_seq <= config.run_length
            self.previous = run if adjacent else None
            run = self.run = Run(speculative)
        run.rates.append(rate)
        run.last_seq = seq
        if len(run.rates) > 2 * k:
            del run.rates[k]  # a long run keeps its two ends
        if len(run.rates) == k:
            self._compare(run, k, config.smoothing)

    def _compare(self, run: Run, k: int, weight: float) -> None:
        before = self.previous
        if before is None or run.compared or not run.rates:
            return
        run.compared = True
        after, ahead = run.rates[:k], before.rates[-k:]
        after_rate, before_rate = sum(after) / len(after), sum(ahead) / len(ahead)
        spec, plain = (after_rate, before_rate) if run.speculative else (before_rate, after_rate)
        self.advantage.add(math.log(spec / plain), weight)

    def explore_interval(self, config: GateConfig) -> int:
        """Winning steps between two runs of the losing mode, so that those runs lose at most
        ``explore_budget`` of the time. A run of L losing steps, with its transition counted as one more,
        takes (L + 1) * t_lose seconds and commits what the winner commits in a share rate_lose / rate_win
        of that; the loss is (L + 1) * t_lose * (1 - rate_lose / rate_win), spread over N winning steps of
        t_win each. Measured on the trained pair at batch 1, an exploration cost about 7 plain steps, where
        counting L steps alone put it at 2."""
        speedup = self.speedup()
        if speedup is None:
            return config.explore_every
        spec_wins = speedup >= 1.0
        win_s, lose_s = ((self.spec_step_s, self.plain_step_s) if spec_wins else (self.plain_step_s, self.spec_step_s))
        if win_s.value <= 0 or speedup <= 0:
            return config.explore_every
        rate_ratio = 1.0 / speedup if spec_wins else speedup  # loser's rate over the winner's
        loss = (config.run_length + 1) * (lose_s.value / win_s.value) * (1.0 - rate_ratio)
        return int(min(config.max_explore_every, max(config.explore_every, loss / config.explore_budget)))

    def predicted_speedup(self, accepted: float) -> float | None:
        """Speculative over plain rate if each request had ``accepted`` drafts accepted per verify step: the measured
        verdict (``speedup``), scaled by the tokens a speculative step would commit per request (1 + accepted) over
        those it committed when measured. The verdict comes from back-to-back runs, so a slow period of the machine
        that fell on one mode's step costs does not move the prediction."""
        speedup = self.speedup()
        if speedup is None or not self.spec_tokens.samples or self.spec_tokens.value <= 0:
            return None
        return speedup * (1.0 + accepted) / self.spec_tokens.value

    def break_even(self) -> float | None:
        """Accepted tokens per verify step at which a request's drafts pay for their verification."""
        if not (self.spec_step_s.samples and self.plain_step_s.samples) or self.plain_step_s.value <= 0:
            return None
        return max(0.0, self.spec_step_s.value / self.plain_step_s.value - 1.0)
