"""The gate binding's verify metrics: tallied per step, published with the report, with the same totals
(drafts, verified and accepted tokens, and accepted tokens per draft position) as per-step writes."""

from types import SimpleNamespace

from pytest import approx

from vllm_luce.spec_decode import scheduler as S


def test_verify_tallies_publish_the_per_position_acceptance_once(monkeypatch):
    written = []
    monkeypatch.setattr(S.metrics, "inc", lambda name, value=1.0, **labels: written.append((name, value, labels)))
    fake = SimpleNamespace(_luce_labels={"model_name": "m"}, _luce_verified=0, _luce_accepted_counts={})
    for verified, accepted in ((15, 3), (15, 0), (7, 7), (15, 3)):
        S.DFlashGateMixin._luce_count_verify(fake, verified, accepted)
    assert written == []  # nothing per step
    S.DFlashGateMixin._luce_publish_verify(fake)
    totals = {(n, l.get("position")): v for n, v, l in written}
    assert totals[("dflash_drafts", None)] == 4
    assert totals[("dflash_verified_tokens", None)] == 52 and totals[("dflash_accepted_tokens", None)] == 13
    # position p counts the steps that accepted more than p drafts
    assert [totals[("dflash_accepted_tokens_per_pos", p)] for p in range(7)] == [3, 3, 3, 1, 1, 1, 1]
    assert sum(totals[("dflash_accepted_tokens_per_pos", p)] for p in range(7)) == 13
    written.clear()
    S.DFlashGateMixin._luce_publish_verify(fake)  # the tally was reset
    assert written == []


def test_report_publishes_each_regimes_rates_and_back_to_back_speedup(monkeypatch):
    from vllm_luce.spec_decode.gate import GateConfig, SpecGate

    gauges = {}
    monkeypatch.setattr(S.metrics, "set_gauge", lambda name, value, **labels: gauges.update(
        {(name, labels.get("mode"), labels.get("batch_le")): value}))
    monkeypatch.setattr(S.metrics, "remove_gauges", lambda name: [gauges.pop(k) for k in list(gauges) if k[0] == name])
    monkeypatch.setattr(S.metrics, "set_total", lambda *a, **k: None)
    gate = SpecGate(GateConfig(run_length=2, pair_samples=2))
    for spec, rate in ((True, 120.0), (True, 120.0), (False, 100.0), (False, 100.0)):
        gate.observe(speculative=spec, batch_size=4, context_tokens=100, committed_tokens=4, seconds=4 / rate)
    fake = SimpleNamespace(luce_gate=gate, _luce_labels={"model_name": "m"}, _luce_verified=0, _luce_accepted_counts={},
                           _luce_reported_at=0.0, _luce_rates_at=0.0)
    fake._luce_publish_verify = lambda: None
    S.DFlashGateMixin._luce_report(fake)
    assert gauges[("dflash_gate_speedup", None, 4)] == approx(1.2)
    assert gauges[("dflash_gate_rate_tokens_per_second", "spec", 4)] == approx(120.0)
    assert gauges[("dflash_gate_rate_tokens_per_second", "plain", 4)] == approx(100.0)


def test_lookup_drafts_nothing_when_no_running_request_may_draft():
    from vllm_luce.spec_decode.gate import GateConfig, SpecGate

    gate = SpecGate(GateConfig(patience=1, retry_after=1000, min_samples=1))  # measured: speculation wins
    gate.observe(speculative=True, batch_size=2, context_tokens=0, committed_tokens=8, seconds=0.02)
    gate.observe(speculative=False, batch_size=2, context_tokens=0, committed_tokens=2, seconds=0.01)
    fake = SimpleNamespace(luce_gate=gate, running=[SimpleNamespace(request_id="a"), SimpleNamespace(request_id="b")],
                           luce_mean_context=lambda: 0, luce_prompt_pending=lambda: False, luce_max_spec_tokens=15)
    lookup = S.GatedLookup(fake)
    assert lookup[2] == 15
    for request in ("a", "b"):  # acceptance below break-even: both stop drafting
        gate.observe_request(request, accepted=0, batch_size=2, context_tokens=0)
    assert gate.stopped_requests() == 2
    assert lookup[2] == 0
    fake.running.append(SimpleNamespace(request_id="c"))  # a new request may draft
    assert lookup[3] == 15
    gate.observe_request("c", accepted=0, batch_size=2, context_tokens=0)
    fake.running[:] = [SimpleNamespace(request_id="a"), SimpleNamespace(request_id="d")]  # b and c wait
    assert gate.stopped_requests() == 3 and lookup[2] == 15  # more stopped than running, but d may draft
    fake.running.pop()
    assert lookup[1] == 0


def _step(spec_drafts: dict, scheduled: dict, sampled: dict, drafting: bool):
    """A finished step as the binding sees it: vLLM's scheduler and model runner outputs, reduced."""
    order = list(scheduled)
    out = SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens=spec_drafts,
                          total_num_scheduled_tokens=sum(scheduled.values()),
                          num_spec_tokens_to_schedule=15 if drafting else 0)
    result = SimpleNamespace(sampled_token_ids=[sampled[r] for r in order],
                             req_id_to_index={r: i for i, r in enumerate(order)})
    return out, result


def _observed(monkeypatch, out, result):
    from vllm_luce.spec_decode.gate import SpecGate

    seen = []
    gate = SpecGate()
    monkeypatch.setattr(gate, "observe", lambda **k: seen.append(k))
    fake = SimpleNamespace(luce_gate=gate, _luce_context=100, _luce_last_update=0.0, _luce_last_log=float("inf"),
                           _luce_count_verify=lambda *a: None)
    S.DFlashGateMixin._luce_observe(fake, out, result, started=0.0)
    return seen


def test_a_decode_step_commits_each_rows_accepted_drafts_and_one_token(monkeypatch):
    out, result = _step({"a": [5] * 15, "b": [5] * 15}, {"a": 16, "b": 16}, {"a": [1] * 4, "b": [1]}, drafting=True)
    [sample] = _observed(monkeypatch, out, result)
    assert sample["speculative"] and not sample["prompt"]
    assert sample["committed_tokens"] == 5  # a: 3 accepted + 1, b: 0 accepted + 1


def test_a_step_with_a_prompt_chunk_is_its_own_regime_and_counts_the_chunk(monkeypatch):
    """The chunk's tokens count as committed in both modes; a speculative step loses its rejected drafts."""
    out, result = _step({"a": [5] * 15}, {"a": 16, "p": 200}, {"a": [1, 1], "p": []}, drafting=True)
    [sample] = _observed(monkeypatch, out, result)
    assert sample["speculative"] and sample["prompt"] and sample["committed_tokens"] == 200 + 2
    out, result = _step({}, {"a": 1, "p": 200}, {"a": [1], "p": []}, drafting=False)
    [sample] = _observed(monkeypatch, out, result)
    assert not sample["speculative"] and sample["prompt"] and sample["committed_tokens"] == 201


def test_prompt_pending_while_a_request_waits_or_a_prompt_is_in_chunks():
    def pending(waiting, *rows):
        fake = SimpleNamespace(waiting=waiting, running=[SimpleNamespace(num_tokens=n, num_computed_tokens=c)
                                                         for n, c in rows])
        return S.DFlashGateMixin.luce_prompt_pending(fake)

    assert not pending([], (100, 99), (40, 39))  # every running request decodes its newest token
    assert pending([object()], (100, 99))  # a request waits
    assert pending([], (100, 99), (900, 320))  # a prompt in chunks
    assert not pending([], (100, 101))  # async scheduling counts drafts computed ahead
