"""The gate binding's verify metrics: tallied per step, published with the report, with the same totals
(drafts, verified and accepted tokens, and accepted tokens per draft position) as per-step writes."""

from types import SimpleNamespace

import pytest
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
                           _luce_reported_at=0.0, _luce_rates_at=0.0, _luce_last_log=0.0)
    fake._luce_publish_verify = lambda: None
    S.DFlashGateMixin._luce_report(fake)
    assert gauges[("dflash_gate_speedup", None, 4)] == approx(1.2)
    assert gauges[("dflash_gate_rate_tokens_per_second", "spec", 4)] == approx(120.0)
    assert gauges[("dflash_gate_rate_tokens_per_second", "plain", 4)] == approx(100.0)


def test_lookup_drafts_nothing_when_no_running_or_admissible_request_may_draft():
    from vllm_luce.spec_decode.gate import GateConfig, SpecGate

    gate = SpecGate(GateConfig(patience=1, retry_after=1000, min_samples=1, run_length=2))  # measured: speculation wins
    for batch in (2, 3):
        gate.observe(speculative=True, batch_size=batch, context_tokens=0, committed_tokens=8, seconds=0.02)
        gate.observe(speculative=False, batch_size=batch, context_tokens=0, committed_tokens=2, seconds=0.01)
    fake = SimpleNamespace(luce_gate=gate, running=[req("a"), req("b")], waiting=[], max_num_running_reqs=8,
                           luce_mean_context=lambda: 0, luce_prompt_pending=lambda: False, luce_max_spec_tokens=15)
    lookup = S.GatedLookup(fake)

    def run(lookup, batch):
        """A run's decision (its first step; the other follows it, plain where nothing could draft)."""
        first, second = lookup[batch], lookup[batch]
        assert second == first
        return first

    assert run(lookup, 2) == 15
    for request in ("a", "b"):  # acceptance below break-even: both stop drafting
        gate.observe_request(request, accepted=0, batch_size=2, context_tokens=0)
    assert gate.stopped_requests() == 2
    assert run(lookup, 2) == 0
    fake.running.append(req("c"))  # a new request may draft
    assert run(lookup, 3) == 15
    gate.observe_request("c", accepted=0, batch_size=2, context_tokens=0)
    fake.running[:] = [req("a"), req("d")]  # b and c wait
    assert gate.stopped_requests() == 3 and run(lookup, 2) == 15  # more stopped than running, but d may draft
    fake.running.pop()
    assert run(lookup, 1) == 0
    fake.running[:] = [req("e", left=2), req("f", left=1)]  # drafts made now could not be used
    assert run(lookup, 2) == 0
    fake.running[1] = req("g", left=3)
    assert run(lookup, 2) == 15
    # A waiting request that a free sequence slot may admit: its prefill step drafts for it, as vLLM's DFlash does.
    fake.running[:], fake.max_num_running_reqs = [req("e", left=2)], 2
    fake.waiting = [req("w", left=2), req("x")]
    assert run(lookup, 2) == 15
    fake.waiting[1] = req("a")  # preempted after the gate stopped it
    assert run(lookup, 2) == 0
    fake.waiting[1] = req("y")
    fake.running.append(req("f", left=2))  # no free slot
    assert run(lookup, 2) == 0


def req(request_id: str, left: int = 100):
    """A running request as the lookup reads it, ``left`` tokens before its max_tokens."""
    return SimpleNamespace(request_id=request_id, max_tokens=200, num_output_tokens=200 - left)


def _step(spec_drafts: dict, scheduled: dict, sampled: dict, drafting: bool):
    """A finished step as the binding sees it: vLLM's scheduler and model runner outputs, reduced."""
    order = list(scheduled)
    out = SimpleNamespace(num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens=spec_drafts,
                          total_num_scheduled_tokens=sum(scheduled.values()),
                          num_spec_tokens_to_schedule=15 if drafting else 0)
    result = SimpleNamespace(sampled_token_ids=[sampled[r] for r in order],
                             req_id_to_index={r: i for i, r in enumerate(order)})
    return out, result


def _observed(monkeypatch, out, result, regime):
    from vllm_luce.spec_decode.gate import SpecGate

    seen = []
    gate = SpecGate()
    monkeypatch.setattr(gate, "observe", lambda **k: seen.append(k))
    fake = SimpleNamespace(luce_gate=gate, _luce_last_update=0.0, _luce_last_log=float("inf"),
                           _luce_count_verify=lambda *a: None)
    S.DFlashGateMixin._luce_observe(fake, out, result, 0.0, regime)
    return seen


def test_a_decode_step_commits_each_rows_accepted_drafts_and_one_token(monkeypatch):
    out, result = _step({"a": [5] * 15, "b": [5] * 15}, {"a": 16, "b": 16}, {"a": [1] * 4, "b": [1]}, drafting=True)
    [sample] = _observed(monkeypatch, out, result, (2, 100, False))
    assert sample["speculative"] and not sample["prompt"]
    assert sample["committed_tokens"] == 5  # a: 3 accepted + 1, b: 0 accepted + 1


def test_a_step_with_a_prompt_chunk_counts_the_chunk(monkeypatch):
    """The chunk's tokens count as committed in both modes; a speculative step loses its rejected drafts."""
    out, result = _step({"a": [5] * 15}, {"a": 16, "p": 200}, {"a": [1, 1], "p": []}, drafting=True)
    [sample] = _observed(monkeypatch, out, result, (2, 100, True))
    assert sample["speculative"] and sample["prompt"] and sample["committed_tokens"] == 200 + 2
    out, result = _step({}, {"a": 1, "p": 200}, {"a": [1], "p": []}, drafting=False)
    [sample] = _observed(monkeypatch, out, result, (2, 100, True))
    assert not sample["speculative"] and sample["prompt"] and sample["committed_tokens"] == 201


def test_a_step_is_observed_in_the_regime_its_mode_was_decided_for(monkeypatch):
    """The plan's batch (running and waiting requests) may exceed what the budget let vLLM schedule; the
    step's cost belongs to the regime that chose its mode. A step no decision was made for (a test's own
    lookup) is not observed."""
    out, result = _step({}, {"a": 1, "b": 1}, {"a": [1], "b": [1]}, drafting=False)
    [sample] = _observed(monkeypatch, out, result, (32, 2048, True))
    assert (sample["batch_size"], sample["context_tokens"], sample["prompt"]) == (32, 2048, True)
    assert _observed(monkeypatch, out, result, None) == []


def test_prompt_pending_while_a_request_waits_or_a_prompt_is_in_chunks():
    def pending(waiting, *rows, after_prompt=True):
        fake = SimpleNamespace(waiting=waiting, running=[SimpleNamespace(num_tokens=n, num_computed_tokens=c)
                                                         for n, c in rows], _luce_prompt_rows=after_prompt)
        return S.DFlashGateMixin.luce_prompt_pending(fake)

    assert not pending([], (100, 99), (40, 39))  # every running request decodes its newest token
    assert pending([object()], (100, 99))  # a request waits
    assert pending([], (100, 99), (900, 320))  # a prompt in chunks
    assert not pending([], (100, 101))  # async scheduling counts drafts computed ahead
    # After a step without prompt tokens no running request can have a prompt left: no scan
    assert not pending([], (100, 99), (900, 320), after_prompt=False) and pending([object()], after_prompt=False)


@pytest.mark.parametrize("new, scheduled, drafts, want", [
    ([], {"a": 1, "b": 1}, {}, False),  # decode rows
    ([], {"a": 16, "b": 1}, {"a": list(range(15))}, False),  # a verify row: its newest token and 15 drafts
    ([], {"a": 1, "b": 64}, {}, True),  # a prompt chunk
    ([], {"a": 16, "b": 64}, {"a": list(range(15))}, True),  # a prompt chunk beside a verify row
    (["c"], {"a": 1, "c": 1}, {}, True),  # a new request, even of one token
])
def test_a_step_carries_prompt_tokens_when_a_row_computes_more_than_its_token_and_drafts(new, scheduled, drafts,
                                                                                       want):
    out = SimpleNamespace(scheduled_new_reqs=new, num_scheduled_tokens=scheduled, scheduled_spec_decode_tokens=drafts,
                          total_num_scheduled_tokens=sum(scheduled.values()))
    assert S.carries_prompt_tokens(out) is want


class _RecordingScheduler:
    """Stands in for vLLM's Scheduler: reads the draft reservation as vLLM 0.32's ``schedule`` does, and asks
    the lookup for K when it scheduled a request."""

    def schedule(self):
        spec = self.vllm_config.speculative_config
        self.reserved.append(spec.max_num_new_slots_for_drafting if spec is not None else 0)
        self.asked.append(self.dynamic_sd_lookup[len(self.running)])
        return SimpleNamespace(num_spec_tokens_to_schedule=self.asked[-1], scheduled_new_reqs=[],
                               scheduled_spec_decode_tokens={}, num_scheduled_tokens={}, total_num_scheduled_tokens=0)

    def add_request(self, request):
        self.requests[request.request_id] = request


class _Gated(S.DFlashGateMixin, _RecordingScheduler):
    pass


def _gated_scheduler(gate, running: int, waiting: int):
    from vllm_luce.spec_decode.scheduler import PlainStepConfig

    sched = object.__new__(_Gated)
    spec = SimpleNamespace(max_num_new_slots_for_drafting=15, num_speculative_tokens=15)
    sched.vllm_config = SimpleNamespace(speculative_config=spec, model_config="real")
    sched.luce_gate, sched.luce_max_spec_tokens, sched.max_num_running_reqs = gate, 15, 32
    sched.running = [SimpleNamespace(request_id=str(i), num_tokens=10, num_computed_tokens=9, max_tokens=100,
                                     num_output_tokens=1, spec_token_ids=[]) for i in range(running)]
    sched.waiting = [object()] * waiting
    sched.dynamic_sd_lookup = S.GatedLookup(sched)
    sched._luce_scheduled_at, sched._luce_regime = {}, None
    sched._luce_plain_config = PlainStepConfig(sched.vllm_config)
    sched._luce_drafts_held = sched._luce_prompt_rows = True
    sched._luce_probe, sched._luce_watch, sched._luce_watch_regime = None, {}, ()
    sched._luce_lean = sched._luce_lean_batch = 0
    sched.reserved, sched.asked, sched.requests = [], [], {}
    return sched


def test_a_plain_step_is_scheduled_without_vllms_draft_slot_reservation():
    """vLLM sets aside K draft slots of the token budget per scheduled request; a step the gate runs plain
    must not (a budget of 320 fits 20 requests at K = 15). The plan is made before scheduling, for the
    running and waiting requests, and is what vLLM's lookup answers."""
    from vllm_luce.spec_decode.gate import GateConfig, SpecGate

    gate = SpecGate(GateConfig(run_length=2, min_samples=1))
    sched = _gated_scheduler(gate, running=20, waiting=30)
    drafts = []
    for _ in range(4):  # calibrating: a plain run, then a speculative one
        sched.schedule()
        drafts.append(sched.luce_step_drafts)  # what the engine core's post-step reads
    assert sched.asked == [0, 0, 15, 15] and sched.reserved == [0, 0, 15, 15]
    assert drafts == [False, False, True, True]
    assert sched.vllm_config.model_config == "real" and sched.vllm_config.speculative_config.num_speculative_tokens == 15
    batch, _, prompt = next(iter(sched._luce_scheduled_at.values()))[1]
    assert (batch, prompt) == (32, True)  # 20 running + 30 waiting, capped at 32 sequences; requests wait


def test_vllm_schedule_reads_the_draft_reservation_where_the_plain_config_answers_it():
    from vllm.v1.core.sched.scheduler import Scheduler

    assert S.schedule_reads_draft_slots(Scheduler)

    class Moved:
        def schedule(self):
            return self.scheduler_config.draft_slots  # a vLLM that reads its reservation elsewhere

    assert not S.schedule_reads_draft_slots(Moved)


def test_a_plain_step_verifies_the_drafts_before_it_only_where_speculation_wins():
    """A plain step where speculation does not win its regime (calibrating here) drops every request's drafts, so
    it verifies none; a speculative step keeps them, and so does a plain step where speculation wins."""
    from vllm_luce.spec_decode.gate import GateConfig, SpecGate

    gate = SpecGate(GateConfig(run_length=2, min_samples=1))
    sched = _gated_scheduler(gate, running=4, waiting=0)

    def step(drafts):
        for request in sched.running:
            request.spec_token_ids = list(drafts)
        sched.schedule()
        return sched.asked[-1], [r.spec_token_ids for r in sched.running]

    assert step([7, 8]) == (0, [[]] * 4)  # calibrating, plain first: dropped
    assert not sched._luce_drafts_held  # until a step drafts, later plain steps have nothing to drop
    assert step([])[0] == 0
    assert step([7, 8]) == (15, [[7, 8]] * 4)  # a speculative step verifies them
    assert sched._luce_drafts_held
    for mode, rate in ((True, 400.0), (False, 100.0)):  # measured: speculation wins at batch 4
        gate.observe(speculative=mode, batch_size=4, context_tokens=0, committed_tokens=int(rate), seconds=1.0)
    gate.regimes[gate.regime_key(4, 0)].last_explore = -10_000  # its plain exploration is due
    sched.schedule()  # the speculative run's second step
    assert step([7, 8]) == (0, [[7, 8]] * 4)  # a plain exploration keeps them


def test_a_probes_drafts_are_dropped_and_compared_with_the_tokens_each_request_commits_after_them():
    """Where plain wins decisively, the gate's re-check is a probe: the binding keeps the drafts the next (plain) step
    drops, and counts for each request the drafts that match the tokens it commits from then on. A request settles at
    its first mismatch, when all its drafts matched, or when it is gone; then the gate gets the mean."""
    from vllm_luce.spec_decode.gate import SpecGate

    gate = SpecGate()
    for mode, seconds in ((True, 1.0), (False, 0.01)):  # batch 4 at context 9: speculation 100x slower
        gate.observe(speculative=mode, batch_size=4, context_tokens=9, committed_tokens=4, seconds=seconds)
    gate.regimes[gate.regime_key(4, 9)].last_explore = -10_000  # its re-check is due
    seen = []
    gate.observe_probe = lambda batch, context, accepted: seen.append((batch, context, accepted))
    sched = _gated_scheduler(gate, running=4, waiting=0)
    sched.schedule()
    assert sched.asked == [15] and gate.probes == 1 and sched._luce_probe == (4, 9)
    for request in sched.running:  # the probe's drafts, after the token it sampled (each request's 5th)
        request.spec_token_ids, request.num_output_tokens = [11, 12, 13], 5
    sched.schedule()
    assert sched.asked[-1] == 0 and all(r.spec_token_ids == [] for r in sched.running)  # dropped, not verified
    assert sched._luce_watch == {str(i): [5, [11, 12, 13], 0, False] for i in range(4)}

    def committed(*tokens):
        return SimpleNamespace(output_token_ids=[1, 2, 3, 4, 5, *tokens], is_finished=lambda: False)

    sched.requests = {"0": committed(11, 12), "1": committed(11, 12), "2": committed(50), "3": committed(11)}
    sched._luce_check_probe()
    assert [e[2:] for e in sched._luce_watch.values()] == [[2, False], [2, False], [0, True], [1, False]]
    sched.requests = {"0": committed(11, 12, 99), "1": committed(11, 12, 13, 14)}  # 3 finished
    sched._luce_check_probe()
    assert seen == [(4, 9, (2 + 3 + 0 + 1) / 4)] and sched._luce_watch == {}


def test_plain_steps_ahead_are_scheduled_without_the_gate_until_the_batch_changes():
    """Where plain wins and the re-check is far off, the binding schedules the gate's ``plain_steps_ahead`` plainly:
    no decision, no observation (nothing kept for update_from_output), vLLM's lookup still answered 0. A waiting
    request (or a change of the running ones) ends them."""
    from vllm_luce.spec_decode.gate import SpecGate

    gate = SpecGate()
    for mode, seconds in ((True, 1.0), (False, 0.01)):  # batch 4 at context 9: speculation 100x slower
        gate.observe(speculative=mode, batch_size=4, context_tokens=9, committed_tokens=4, seconds=seconds)
    sched = _gated_scheduler(gate, running=4, waiting=0)
    sched._luce_prompt_rows = False
    outputs = [sched.schedule()]  # kept: the binding keys a step's decision by its output's id
    ahead = sched._luce_lean
    assert sched.asked == [0] and ahead > 100 and id(outputs[0]) in sched._luce_scheduled_at
    decided = gate.step
    outputs += [sched.schedule() for _ in range(5)]
    assert sched.asked == [0] * 6 and sched.reserved == [0] * 6 and not sched.luce_step_drafts
    assert gate.step == decided + 5 and gate.decisions["plain"] == 6 and sched._luce_lean == ahead - 5
    assert not any(id(o) in sched._luce_scheduled_at for o in outputs[1:])  # lean steps are not observed
    sched.waiting = [object()]
    outputs.append(sched.schedule())
    assert sched._luce_lean == 0 and id(outputs[-1]) in sched._luce_scheduled_at


def test_a_request_that_declines_speculation_verifies_no_drafts_while_the_others_do():
    """vllm_xargs luce_dflash off: the scheduler marks the request at add_request; its drafts are dropped before
    every step while the other requests' are verified, and a batch of only such requests runs plain."""
    from vllm_luce.spec_decode.gate import GateConfig, SpecGate

    gate = SpecGate(GateConfig(run_length=2, min_samples=1))
    sched = _gated_scheduler(gate, running=0, waiting=0)
    for i, xargs in enumerate(({"luce_dflash": "off"}, None, {"luce_dflash": "on"})):
        request = SimpleNamespace(request_id=str(i), num_tokens=10, num_computed_tokens=9, max_tokens=100,
                                  num_output_tokens=1, spec_token_ids=[], sampling_params=SimpleNamespace(extra_args=xargs))
        sched.add_request(request)
        sched.running.append(request)
    assert list(sched.requests) == ["0", "1", "2"] and gate.declined == {"0"}
    for mode, rate in ((True, 400.0), (False, 100.0)):  # speculation wins at batch 3
        gate.observe(speculative=mode, batch_size=3, context_tokens=0, committed_tokens=int(rate), seconds=1.0)
    for request in sched.running:
        request.spec_token_ids = [7, 8]
    sched.schedule()
    assert sched.asked[-1] == 15 and [r.spec_token_ids for r in sched.running] == [[], [7, 8], [7, 8]]
    sched.running = sched.running[:1]  # only the declining request runs: nothing may draft, the step is plain
    sched.running[0].spec_token_ids = [7, 8]
    sched.schedule()
    assert sched.asked[-1] == 0 and sched.running[0].spec_token_ids == []
    sched.requests = {}
    sched._luce_release_finished()
    assert gate.declined == set()
