"""What the DFlash gate reports: ``vllm:luce_dflash_*`` metrics and a log line (pure: no vLLM import).

The scheduler binding (``scheduler.py``) tallies each verified request here and publishes every
``REPORT_EVERY_S`` while requests run, and whenever the engine drains.
"""

from __future__ import annotations

import time

from vllm_luce import metrics
from vllm_luce.log import logger, tag

LOG_EVERY_S = 10.0
REPORT_EVERY_S = 0.25


class GateReport:
    def __init__(self, labels: dict):
        self.labels = labels
        self.verified = 0  # drafts sent to verification since the last report
        self.accepted_counts: dict[int, int] = {}  # accepted drafts -> verify steps, since the last report
        self.reported_at = 0.0
        self.logged_at = time.monotonic()

    def verify(self, drafts: int, accepted: int) -> None:
        """One request's verify step: ``accepted`` of its ``drafts`` were accepted."""
        self.verified += drafts
        self.accepted_counts[accepted] = self.accepted_counts.get(accepted, 0) + 1

    def due(self, draining: bool) -> bool:
        return draining or time.monotonic() - self.reported_at >= REPORT_EVERY_S

    def publish(self, gate) -> None:
        """The gate's state and the verify tallies into the metrics; its summary into the log every
        ``LOG_EVERY_S``."""
        labels, counts = self.labels, self.accepted_counts
        now = self.reported_at = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_S:
            self.logged_at = now
            logger.info("%s: %s", tag(), summary(gate))
        if counts:
            metrics.inc("dflash_drafts", sum(counts.values()), **labels)
            metrics.inc("dflash_verified_tokens", self.verified, **labels)
            metrics.inc("dflash_accepted_tokens", sum(a * n for a, n in counts.items()), **labels)
            for position in range(max(counts)):  # drafts accepted at a position: the steps that accepted more
                metrics.inc("dflash_accepted_tokens_per_pos", sum(n for a, n in counts.items() if a > position),
                            position=position, **labels)
            self.verified, self.accepted_counts = 0, {}
        for mode, steps in gate.decisions.items():
            metrics.set_total("dflash_gate_steps", steps, mode=mode, **labels)
        metrics.set_total("dflash_gate_explorations", gate.explorations, **labels)
        metrics.set_gauge("dflash_gate_speculating", float(gate.speculating), **labels)
        metrics.set_gauge("dflash_requests_not_drafting", len(gate.stopped), **labels)
        for b, r in sorted(gate.regimes.items()):
            for mode, rate in (("spec", r.rate[True]), ("plain", r.rate[False])):
                if rate.samples:
                    metrics.set_gauge("dflash_gate_rate_tokens_per_second", rate.value, mode=mode, batch_le=b,
                                      **labels)
            if r.speedup() is not None:
                metrics.set_gauge("dflash_gate_speedup", r.speedup(), batch_le=b, **labels)


def summary(gate) -> str:
    parts = []
    for b, r in sorted(gate.regimes.items()):
        w = r.winner(gate.config)
        mode = "calibrating" if w is None else ("spec" if w else "plain")
        parts.append(f"batch<={b}: spec {r.rate[True].value:.1f} tok/s vs plain {r.rate[False].value:.1f} tok/s"
                     f" -> {mode}")
    return (f"gate: {gate.decisions['spec']} spec / {gate.decisions['plain']} plain steps, "
            f"{gate.explorations} explorations, {len(gate.stopped)} requests not drafting; "
            + ("; ".join(parts) or "no regimes yet"))
