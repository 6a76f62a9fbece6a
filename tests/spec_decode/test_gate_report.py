"""The DFlash gate's report: verify tallies and the gate's state into vllm:luce_dflash_* metrics."""

from pytest import approx

from vllm_luce.spec_decode import gate_report as R
from vllm_luce.spec_decode.gate import GateConfig, SpecGate


def test_verify_tallies_and_the_gates_state_are_published_with_the_report(monkeypatch):
    written, gauges, totals = [], {}, {}
    monkeypatch.setattr(R.metrics, "inc", lambda name, value=1.0, **labels: written.append((name, value, labels)))
    monkeypatch.setattr(R.metrics, "set_gauge", lambda name, value, **labels: gauges.update(
        {(name, labels.get("mode"), labels.get("batch_le")): value}))
    monkeypatch.setattr(R.metrics, "set_total", lambda name, value, **labels: totals.update(
        {(name, labels.get("mode")): value}))
    gate = SpecGate(GateConfig(min_samples=1))
    for spec, rate in ((True, 120.0), (False, 100.0)):
        gate.observe(speculative=spec, batch_size=4, committed_tokens=4, seconds=4 / rate)
    report = R.GateReport({"model_name": "m"})
    for verified, accepted in ((15, 3), (15, 0), (7, 7), (15, 3)):
        report.verify(verified, accepted)
    report.publish(gate)
    got = {(n, l.get("position")): v for n, v, l in written}
    assert got[("dflash_drafts", None)] == 4
    assert got[("dflash_verified_tokens", None)] == 52 and got[("dflash_accepted_tokens", None)] == 13
    # position p counts the verify steps that accepted more than p drafts
    assert [got[("dflash_accepted_tokens_per_pos", p)] for p in range(7)] == [3, 3, 3, 1, 1, 1, 1]
    assert gauges[("dflash_gate_speedup", None, 4)] == approx(1.2)
    assert gauges[("dflash_gate_rate_tokens_per_second", "spec", 4)] == approx(120.0)
    assert gauges[("dflash_gate_rate_tokens_per_second", "plain", 4)] == approx(100.0)
    assert ("dflash_gate_steps", "spec") in totals and ("dflash_gate_explorations", None) in totals
    written.clear()
    report.publish(gate)  # the tally was reset
    assert not [w for w in written if w[0].startswith("dflash_")]


def test_a_report_is_due_when_the_engine_drains_or_its_interval_passed():
    report = R.GateReport({})
    report.reported_at = float("inf")
    assert report.due(draining=True) and not report.due(draining=False)
    report.reported_at = 0.0
    assert report.due(draining=False)
