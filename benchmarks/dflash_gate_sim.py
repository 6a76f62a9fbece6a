"""The DFlash gate core against an oracle, on simulated noisy step times (pure: no vLLM, a few seconds).

    python -m benchmarks.dflash_gate_sim

Each simulated step of batch 1 takes 5 ms (plain) or ``spec_cost`` x 5 ms (speculative, committing
2 tokens), times log-normal noise (sigma 0.15), a slow +-15% drift of the machine's speed and a 3%
chance of a 2x hiccup. The gate sees only clean steps (not the first of a run), as the scheduler
binding does. Efficiency is committed tokens per second against an oracle that always runs the
faster mode on the same noise; 1.0 means exploring and misjudging cost nothing.
"""

from __future__ import annotations

import argparse
import math
import random

from vllm_luce.spec_decode.gate import GateConfig, SpecGate

CASES = {"spec 25% faster": 1.6, "spec 5% faster": 1.9, "spec 5% slower": 2.1, "spec 20% slower": 2.4,
         "spec 30% slower": 2.6, "spec 2.5x slower": 5.0, "spec 10x slower": 20.0}


class Oracle:
    def __init__(self, spec_cost: float):
        self.spec = spec_cost < 2.0

    def decide(self, batch_size, context_tokens):
        return self.spec

    def observe(self, **step):
        pass


def simulate(gate, spec_cost: float, steps: int, seed: int) -> tuple[float, float]:
    """(share of speculative steps, committed tokens per second)."""
    rnd = random.Random(seed)
    seconds = tokens = spec_steps = 0
    previous = None
    for t in range(steps):
        spec = gate.decide(1, 100)
        step_s = 0.005 / (1 + 0.15 * math.sin(t / 150)) * (spec_cost if spec else 1.0) * math.exp(rnd.gauss(0, 0.15))
        if rnd.random() < 0.03:
            step_s *= 2.0
        committed = 2 if spec else 1
        if spec == previous:
            gate.observe(speculative=spec, batch_size=1, context_tokens=100, committed_tokens=committed,
                         seconds=step_s)
        previous = spec
        seconds, tokens, spec_steps = seconds + step_s, tokens + committed, spec_steps + spec
    return spec_steps / steps, tokens / seconds


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--explore-budget", type=float, default=GateConfig.explore_budget)
    args = ap.parse_args(argv)
    print("| case | speculative share (min-max) | efficiency vs oracle (min / mean) |\n| --- | --- | --- |")
    for name, spec_cost in CASES.items():
        runs = [simulate(SpecGate(GateConfig(explore_budget=args.explore_budget)), spec_cost, args.steps, s)
                for s in range(args.seeds)]
        ideal = [simulate(Oracle(spec_cost), spec_cost, args.steps, s)[1] for s in range(args.seeds)]
        share = [r[0] for r in runs]
        eff = [r[1] / i for r, i in zip(runs, ideal)]
        print(f"| {name} | {min(share):.3f}-{max(share):.3f} | {min(eff):.3f} / {sum(eff) / len(eff):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
