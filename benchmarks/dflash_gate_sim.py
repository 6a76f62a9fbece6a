"""The DFlash gate core against an oracle, on simulated noisy step times (pure: no vLLM, a few seconds).

    python -m benchmarks.dflash_gate_sim

Each simulated step of batch 1 takes 5 ms (plain) or ``spec_cost`` x 5 ms (speculative, committing
``spec_tokens``), times log-normal noise (sigma 0.15), a slow +-15% drift of the machine's speed and a 3%
chance of a 2x hiccup. ``spec_tokens`` is a count (every verify step commits it) or, below 1, a drafter
right with that probability per position: a verify step commits 1 + the drafts accepted before the first
wrong one, of K = 15, as DFlash's do (at p = 0.5 half the verify steps commit one token). The GPU cases
take a speculative step's cost over a plain one at batch 1 (``GPU_SPEC_COST``) from the median step times of
docs/benchmarks.md's DFlash run through vLLM 0.26 (Qwen3-8B shape). In the cases that say so the text changes
halfway, and with it which mode wins. As in the scheduler binding, a plain step verifies no drafts, and the
first step of a speculative run verifies nothing (it costs a speculative step and commits one token): the gate
sees only the other steps. Efficiency is committed tokens per second against an oracle that always runs the
faster mode on the same noise; 1.0 means exploring and misjudging cost nothing.
"""

from __future__ import annotations

import argparse
import math
import random

from vllm_luce.spec_decode.gate import GateConfig, SpecGate

K = 15  # drafts per speculative step
GPU_SPEC_COST = 6.68 / 5.31  # a speculative step over a plain one, batch 1 (H200, docs/benchmarks.md's DFlash run)

# name: phases of equal length, each (spec_cost, spec_tokens)
CASES = {"spec 25% faster": [(1.6, 2)], "spec 5% faster": [(1.9, 2)], "spec 5% slower": [(2.1, 2)],
         "spec 20% slower": [(2.4, 2)], "spec 30% slower": [(2.6, 2)], "spec 2.5x slower": [(5.0, 2)],
         "spec 10x slower": [(20.0, 2)], "spec turns 2x faster halfway": [(1.5, 1), (1.5, 3)],
         "spec turns 2x slower halfway": [(1.5, 3), (1.5, 1)],
         "GPU, drafts right at p = 0.3": [(GPU_SPEC_COST, 0.3)], "GPU, p = 0.5": [(GPU_SPEC_COST, 0.5)],
         "GPU, p = 0.9": [(GPU_SPEC_COST, 0.9)], "GPU, p = 0.9 turns 0 halfway": [(GPU_SPEC_COST, 0.9),
                                                                                (GPU_SPEC_COST, 0.0)],
         "GPU, p = 0 turns 0.5 halfway": [(GPU_SPEC_COST, 0.0), (GPU_SPEC_COST, 0.5)]}


def phase(phases, t: int, steps: int) -> tuple[float, float]:
    return phases[min(len(phases) - 1, t * len(phases) // steps)]


def mean_tokens(spec_tokens: float) -> float:
    """Committed tokens of a verify step on average."""
    return 1.0 + sum(spec_tokens ** j for j in range(1, K + 1)) if spec_tokens < 1 else spec_tokens


def verify_tokens(spec_tokens: float, rnd: random.Random) -> int:
    if spec_tokens >= 1:
        return int(spec_tokens)
    accepted = 0
    while accepted < K and rnd.random() < spec_tokens:
        accepted += 1
    return 1 + accepted


class Oracle:
    def __init__(self, phases, steps: int):
        self.phases, self.steps, self.t = phases, steps, 0

    def decide(self, batch_size):
        spec_cost, spec_tokens = phase(self.phases, self.t, self.steps)
        self.t += 1
        return mean_tokens(spec_tokens) / spec_cost > 1.0

    def observe(self, **step):
        pass


def simulate(gate, phases, steps: int, seed: int) -> tuple[float, float]:
    """(share of speculative steps, committed tokens per second)."""
    rnd = random.Random(seed)
    seconds = tokens = spec_steps = 0
    previous = None
    for t in range(steps):
        spec = gate.decide(1)
        spec_cost, spec_tokens = phase(phases, t, steps)
        step_s = 0.005 / (1 + 0.15 * math.sin(t / 150)) * (spec_cost if spec else 1.0) * math.exp(rnd.gauss(0, 0.15))
        if rnd.random() < 0.03:
            step_s *= 2.0
        verifies = bool(previous) and spec  # a plain step drops the drafts
        committed = verify_tokens(spec_tokens, rnd) if verifies else 1
        if spec == verifies:  # a clean sample, as the scheduler binding reports it
            gate.observe(speculative=spec, batch_size=1, committed_tokens=committed, seconds=step_s)
        previous = spec
        seconds, tokens, spec_steps = seconds + step_s, tokens + committed, spec_steps + spec
    return spec_steps / steps, tokens / seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--explore-budget", type=float, default=GateConfig.explore_budget)
    ap.add_argument("--smoothing", type=float, default=GateConfig.smoothing)
    args = ap.parse_args(argv)
    print("| case | speculative share (min-max) | efficiency vs oracle (min / mean) |\n| --- | --- | --- |")
    for name, phases in CASES.items():
        ideal = [simulate(Oracle(phases, args.steps), phases, args.steps, s)[1] for s in range(args.seeds)]
        config = GateConfig(explore_budget=args.explore_budget, smoothing=args.smoothing)
        runs = [simulate(SpecGate(config), phases, args.steps, s) for s in range(args.seeds)]
        eff = [r[1] / i for r, i in zip(runs, ideal)]
        share = [r[0] for r in runs]
        print(f"| {name} | {min(share):.3f}-{max(share):.3f} | {min(eff):.3f} / {sum(eff) / len(eff):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
