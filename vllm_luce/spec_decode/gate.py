"""The self-calibrating DFlash gate (pure: no vLLM import).

Speculation pays when it commits more tokens per second than plain decoding. Which one does depends on
the batch size, the drafter, the text and the hardware, so the gate measures both instead of guessing.
Per batch-size regime (powers of two) it keeps a smoothed rate of committed tokens per second for
speculative and for plain steps, runs the faster mode, and re-runs the slower one on a time budget, so
a stale estimate cannot lock a regime into the wrong mode. Per request it stops drafting where the
accepted drafts stay below break-even, and retries later. A request may decline speculation outright.

A decision holds for ``run_length`` steps: drafts made in one step are verified in the next, so the
first step of a speculative run verifies nothing (a transition, not a sample). A plain step verifies no
drafts (the binding drops them), so every plain step is a sample. Both modes are lossless: a decision
changes speed, never output.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def bucket(n: int) -> int:
    """0 for n <= 0, else the power of two at or above n: regimes 1, 2, 4, 8, ..."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


@dataclass
class Average:
    value: float = 0.0
    samples: int = 0

    def add(self, x: float, weight: float) -> None:
        """The plain mean of the first 1 / ``weight`` samples, then an exponential average of this weight."""
        weight = max(weight, 1.0 / (self.samples + 1))
        self.value += weight * (x - self.value)
        self.samples += 1


@dataclass(frozen=True)
class GateConfig:
    run_length: int = 3  # steps a decision holds
    min_samples: int = 4  # measured steps of each mode before a regime decides: two runs of each
    # A speculative step commits 1 + the drafts accepted before the first wrong one, so at moderate acceptance its
    # rate is heavy-tailed (at 0.5 per position half the verify steps commit one token). Averaged over ~4 steps
    # (0.25), chance runs of such steps flipped a regime to plain, where it stayed until the next re-run, and the
    # gate fell behind fixed DFlash at batch 1 (benchmarks/dflash_gate_sim.py reproduces it). Averaged over ~16
    # steps it keeps up (docs/benchmarks.md, "DFlash gate: what each mechanism gains"); a regime whose winner
    # really changes switches at its next re-run.
    smoothing: float = 1 / 16  # weight of a new sample in the moving averages (their first samples: plain mean)
    explore_budget: float = 0.005  # share of time re-running the losing mode may lose against the winner
    explore_every: int = 64  # fewest steps of a regime between two such re-runs
    max_explore_every: int = 4096  # most steps between them
    patience: int = 8  # verify steps below break-even in a row before a request stops drafting
    retry_after: int = 64  # gate steps a stopped request waits before drafting again
    # A request's acceptance varies a lot from step to step (a drafter right 90% of the time per position accepts
    # 0-3 drafts in a third of its verify steps). Judged on a short average, requests of such a drafter were
    # stopped by chance and finished last, at one token a step, and the gate fell behind fixed DFlash. So a request
    # stops only when even the upper end of its average's spread (three standard errors; with two, a third of a
    # drafter's requests at 1.0 accepted against a break-even of 0.8 stopped by chance) stays below break-even for
    # ``patience`` steps (docs/benchmarks.md, "DFlash gate: what each mechanism gains").
    request_smoothing: float = 0.1  # weight of a verify step in a request's average acceptance
    min_request_samples: int = 12  # verify steps before a request may be stopped

    def __post_init__(self):
        if self.run_length < 2 or not self.run_length < self.explore_every <= self.max_explore_every or min(
                self.min_samples, self.patience, self.retry_after) < 1:
            raise ValueError(f"GateConfig needs run_length >= 2, run_length < explore_every <= max_explore_every "
                             f"and the counts >= 1, got {self}")
        if not (0.0 < self.smoothing <= 1.0 and 0.0 < self.request_smoothing <= 1.0):
            raise ValueError(f"GateConfig.smoothing and request_smoothing must be in (0, 1], got {self}")
        if self.min_request_samples < 1:
            raise ValueError(f"GateConfig.min_request_samples must be >= 1, got {self.min_request_samples}")
        if not 0.0 < self.explore_budget < 1.0:
            raise ValueError(f"GateConfig.explore_budget must be in (0, 1), got {self.explore_budget}")


@dataclass
class Regime:
    """One batch-size bucket: per mode (True: speculative), committed tokens per second and seconds per
    request of a step."""

    rate: dict = field(default_factory=lambda: {True: Average(), False: Average()})
    step_s: dict = field(default_factory=lambda: {True: Average(), False: Average()})
    steps: int = 0
    last_explore: int = 0
    runs: dict = field(default_factory=lambda: {True: 0, False: 0})  # runs started, by mode

    def speedup(self) -> float | None:
        """Speculative over plain rate; None before both modes are measured."""
        spec, plain = self.rate[True], self.rate[False]
        return spec.value / plain.value if spec.samples and plain.samples and plain.value > 0 else None

    def winner(self, config: GateConfig) -> bool | None:
        """True if speculation is faster, False if plain is, None while calibrating."""
        if min(self.rate[True].samples, self.rate[False].samples) < config.min_samples:
            return None
        return self.speedup() >= 1.0

    def explore_interval(self, config: GateConfig) -> int:
        """Winning steps between two runs of the losing mode, so those runs lose at most ``explore_budget`` of
        the time: a run costs ``run_length`` losing steps and one more (the transition at a switch), and commits
        what the winner would in a share rate_lose / rate_win of that time."""
        speedup, spec_wins = self.speedup(), self.winner(config)
        if spec_wins is None or speedup <= 0 or self.step_s[spec_wins].value <= 0:
            return config.explore_every
        win, lose = self.step_s[spec_wins].value, self.step_s[not spec_wins].value
        rate_ratio = 1.0 / speedup if spec_wins else speedup
        loss = (config.run_length + 1) * (lose / win) * (1.0 - rate_ratio)
        return int(min(config.max_explore_every, max(config.explore_every, loss / config.explore_budget)))

    def break_even(self) -> float | None:
        """Accepted drafts per verify step at which a request's drafts pay for their share of the extra step
        time: t_spec / t_plain - 1 (per request, both measured here)."""
        spec, plain = self.step_s[True], self.step_s[False]
        if not (spec.samples and plain.samples) or plain.value <= 0:
            return None
        return max(0.0, spec.value / plain.value - 1.0)


@dataclass
class RequestState:
    accepted: Average = field(default_factory=Average)
    squared: Average = field(default_factory=Average)  # of accepted**2: the spread of the average
    low_streak: int = 0

    def add(self, accepted: float, weight: float) -> None:
        self.accepted.add(accepted, weight)
        self.squared.add(accepted * accepted, weight)

    def upper(self, weight: float) -> float:
        """The average acceptance plus three of its standard errors."""
        weight = max(weight, 1.0 / max(1, self.accepted.samples))
        variance = max(0.0, self.squared.value - self.accepted.value ** 2)
        return self.accepted.value + 3.0 * (variance * weight / (2.0 - weight)) ** 0.5


class SpecGate:
    def __init__(self, config: GateConfig = GateConfig()):
        self.config = config
        self.regimes: dict[int, Regime] = {}
        self.requests: dict[str, RequestState] = {}
        self.stopped: dict[str, int] = {}  # requests not drafting -> the gate step they stopped at
        self.declined: set[str] = set()  # requests that asked for no speculation (vllm_xargs luce_dflash off)
        self.step = 0
        self.decisions = {"spec": 0, "plain": 0}
        self.explorations = 0
        self.speculating = False  # what the latest step runs
        self._mode, self._hold, self._run_regime = False, 0, None

    def regime(self, batch_size: int) -> Regime:
        key = bucket(batch_size)
        r = self.regimes.get(key)
        if r is None:
            r = self.regimes[key] = Regime()
        return r

    def decide(self, batch_size: int, drafting=True) -> bool:
        """Speculate on the next step of a batch of this size? ``drafting``: whether any request of the batch
        may draft, or a function that says so (asked only when the gate would speculate); with none the step
        runs plain, since its drafts could not be used."""
        self.step += 1
        r = self.regime(batch_size)
        r.steps += 1
        if self._hold > 0 and r is self._run_regime:
            self._hold -= 1
            choice = self._mode
        else:
            choice = self._start_run(r)
        if choice and not (drafting() if callable(drafting) else drafting):
            choice = False
        self.decisions["spec" if choice else "plain"] += 1
        self.speculating = choice
        return choice

    def _start_run(self, r: Regime) -> bool:
        winner = r.winner(self.config)
        if winner is None:  # calibrating: alternate runs, plain first
            choice = r.runs[True] < r.runs[False]
        elif r.steps - r.last_explore >= r.explore_interval(self.config):  # re-run the losing mode
            choice, r.last_explore = not winner, r.steps
            self.explorations += 1
        else:
            choice = winner
        r.runs[choice] += 1
        self._mode, self._hold, self._run_regime = choice, self.config.run_length - 1, r
        return choice

    def observe(self, *, speculative: bool, batch_size: int, committed_tokens: int, seconds: float) -> None:
        """One measured step: its mode, its batch, the tokens it committed and its wall time."""
        if seconds <= 0 or committed_tokens <= 0 or batch_size <= 0:
            return
        r, w = self.regime(batch_size), self.config.smoothing
        r.rate[speculative].add(committed_tokens / seconds, w)
        r.step_s[speculative].add(seconds / batch_size, w)

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

    def observe_request(self, request_id: str, accepted: int, batch_size: int) -> None:
        """A verify step of one request: ``accepted`` of its drafts were accepted."""
        state = self.requests.setdefault(request_id, RequestState())
        state.add(float(accepted), self.config.request_smoothing)
        threshold = self.regime(batch_size).break_even()
        if threshold is None or state.accepted.samples < self.config.min_request_samples:
            return
        state.low_streak = state.low_streak + 1 if state.upper(self.config.request_smoothing) < threshold else 0
        if state.low_streak >= self.config.patience and request_id not in self.stopped:
            self.stopped[request_id] = self.step

    def forget(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.stopped.pop(request_id, None)
        self.declined.discard(request_id)
