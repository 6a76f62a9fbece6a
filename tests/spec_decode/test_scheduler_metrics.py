"""The gate's scheduler binding without an engine: what it plans, which drafts it drops before vLLM schedules,
which steps it measures, and the metrics it publishes."""

from types import SimpleNamespace

import pytest

from vllm_luce.spec_decode import scheduler as S
from vllm_luce.spec_decode.gate import GateConfig, SpecGate
from vllm_luce.spec_decode.gate_report import GateReport


def req(request_id: str, drafts=(), xargs=None):
    return SimpleNamespace(request_id=request_id, spec_token_ids=list(drafts),
                           sampling_params=SimpleNamespace(extra_args=xargs))


class _RecordingScheduler:
    """Stands in for vLLM's Scheduler: asks the lookup for K when it schedules a request, schedules each running
    request's drafts as they are, and admits the waiting ones."""

    def schedule(self):
        k = self.dynamic_sd_lookup[len(self.running)] if self.running else self.luce_max_spec_tokens
        self.asked.append(k)
        drafts = {r.request_id: r.spec_token_ids for r in self.running if r.spec_token_ids}
        new = [r.request_id for r in self.waiting]  # admitted (their rows are left out here)
        return SimpleNamespace(num_spec_tokens_to_schedule=k, scheduled_new_reqs=new, scheduled_spec_decode_tokens=drafts,
                               num_scheduled_tokens={r.request_id: 1 + len(r.spec_token_ids) for r in self.running},
                               total_num_scheduled_tokens=sum(1 + len(r.spec_token_ids) for r in self.running))

    def add_request(self, request):
        self.requests[request.request_id] = request

    def update_from_output(self, scheduler_output, model_runner_output):
        return "vllm's result"


class _Gated(S.DFlashGateMixin, _RecordingScheduler):
    pass


def gated(gate, running=(), waiting=(), max_seqs=32):
    sched = object.__new__(_Gated)
    sched.luce_gate, sched.luce_max_spec_tokens, sched.max_num_running_reqs = gate, 15, max_seqs
    sched.running, sched.waiting, sched.requests, sched.asked = list(running), list(waiting), {}, []
    sched.dynamic_sd_lookup = S.GatedLookup(sched)
    sched._luce_batch, sched._luce_scheduled_at, sched._luce_last_update, sched._luce_planned = 0, {}, 0.0, None
    sched.luce_report = GateReport({"model_name": "m"})
    sched.luce_report.reported_at = sched.luce_report.logged_at = float("inf")  # published only when draining
    return sched


def spec_wins(gate, batch):
    """Measured: a speculative step takes 2x a plain one's time (break-even: 1 accepted draft) and commits 8x."""
    for mode, tokens, seconds in ((True, 800, 2.0), (False, 100, 1.0)):
        for _ in range(gate.config.min_samples):
            gate.observe(speculative=mode, batch_size=batch, committed_tokens=tokens, seconds=seconds)


def test_the_plan_covers_running_and_admissible_waiting_requests_and_is_what_vllm_is_answered():
    gate = SpecGate(GateConfig(run_length=2))
    sched = gated(gate, running=[req(str(i)) for i in range(20)], waiting=[req(f"w{i}") for i in range(30)])
    for _ in range(4):  # calibrating: a plain run, then a speculative one
        sched.schedule()
    assert sched.asked == [0, 0, 15, 15] and sched._luce_batch == 32  # 20 running + 30 waiting, capped at 32
    assert set(gate.regimes) == {32} and sched.dynamic_sd_lookup.planned is None


def test_a_plain_step_drops_every_draft_and_so_does_the_next_one_and_a_speculative_one_keeps_them():
    gate = SpecGate(GateConfig(run_length=2))
    sched = gated(gate, running=[req(str(i)) for i in range(4)])

    def step(drafts):
        for request in sched.running:
            request.spec_token_ids = list(drafts)
        out = sched.schedule()
        return out.num_spec_tokens_to_schedule, [r.spec_token_ids for r in sched.running]

    assert step([7, 8]) == (0, [[]] * 4)  # calibrating, plain first: it verifies nothing
    assert step([7, 8]) == (0, [[]] * 4)
    assert step([7, 8]) == (15, [[]] * 4)  # the drafts came from a plain step, which ran no drafter (V2)
    assert step([7, 8]) == (15, [[7, 8]] * 4)


def test_drafts_of_stopped_requests_are_dropped_on_every_step_and_a_batch_with_none_that_may_draft_runs_plain():
    gate = SpecGate(GateConfig(run_length=2, min_samples=1, patience=1, retry_after=1000, min_request_samples=1))
    spec_wins(gate, 2)
    spec_wins(gate, 3)
    sched = gated(gate, running=[req("a", [7]), req("b", [7])])
    assert sched.schedule().num_spec_tokens_to_schedule == 15
    gate.observe_request("a", accepted=0, batch_size=2)  # below break-even (1): a stops drafting
    for r in sched.running:
        r.spec_token_ids = [7]
    assert sched.schedule().scheduled_spec_decode_tokens == {"b": [7]}
    gate.observe_request("b", accepted=0, batch_size=2)
    assert [sched.schedule().num_spec_tokens_to_schedule for _ in range(2)] == [0, 0]  # nobody may draft
    sched.waiting = [req("c")]  # a waiting request a free slot may admit may draft
    assert sched.schedule().num_spec_tokens_to_schedule == 15
    sched.max_num_running_reqs = 2  # no free slot for it
    assert [sched.schedule().num_spec_tokens_to_schedule for _ in range(2)] == [0, 0]


def test_a_request_that_declines_speculation_verifies_no_drafts_while_the_others_do():
    """vllm_xargs luce_dflash off: marked at add_request; its drafts are dropped before every step while the other
    requests' are verified; a batch of only such requests runs plain; its state goes when it finishes."""
    gate = SpecGate(GateConfig(run_length=2, min_samples=1))
    sched = gated(gate)
    for i, xargs in enumerate(({"luce_dflash": "off"}, None, {"luce_dflash": "on"})):
        request = req(str(i), xargs=xargs)
        sched.add_request(request)
        sched.running.append(request)
    assert list(sched.requests) == ["0", "1", "2"] and gate.declined == {"0"}
    spec_wins(gate, 3)
    for request in sched.running:
        request.spec_token_ids = [7, 8]
    sched.schedule()
    assert sched.asked[-1] == 15 and [r.spec_token_ids for r in sched.running] == [[], [7, 8], [7, 8]]
    sched.running = sched.running[:1]  # only the declining request runs: nothing may draft, the step is plain
    sched.running[0].spec_token_ids = [7, 8]
    sched.schedule()
    assert sched.asked[-1] == 0 and sched.running[0].spec_token_ids == []
    sched.requests = {}
    out = sched.schedule()
    assert sched.update_from_output(out, SimpleNamespace(sampled_token_ids=[], req_id_to_index={})) == "vllm's result"
    assert gate.declined == set()


def step_result(out, sampled: dict):
    order = list(out.num_scheduled_tokens)
    return SimpleNamespace(sampled_token_ids=[sampled[r] for r in order],
                           req_id_to_index={r: i for i, r in enumerate(order)})


def test_a_measured_step_commits_each_rows_accepted_drafts_and_one_token(monkeypatch):
    gate = SpecGate(GateConfig(run_length=2, min_samples=1))
    seen = []
    monkeypatch.setattr(gate, "observe", lambda **k: seen.append(k))
    sched = gated(gate, running=[req("a"), req("b")])
    sched.requests = {r.request_id: r for r in sched.running}
    for _ in range(2):  # calibration's plain run: both steps measured
        out = sched.schedule()
        sched.update_from_output(out, step_result(out, {"a": [1], "b": [1]}))
    assert [s["speculative"] for s in seen] == [False, False] and seen[0]["committed_tokens"] == 2
    sched.schedule()  # a speculative run's transition: it drafts, verifies nothing
    for r in sched.running:
        r.spec_token_ids = [5] * 15
    out = sched.schedule()
    sched.update_from_output(out, step_result(out, {"a": [1] * 4, "b": [1]}))
    assert seen[-1]["speculative"] and seen[-1]["committed_tokens"] == 5  # a: 3 accepted + 1, b: 0 + 1
    assert len(seen) == 3  # the transition was not measured
    sched.waiting = [req("c")]  # a step with a prompt is not measured either
    out = sched.schedule()
    sched.update_from_output(out, step_result(out, {"a": [1] * 4, "b": [1]}))
    assert len(seen) == 3
    assert gate.requests["a"].accepted.value == 3 and gate.requests["b"].accepted.value == 0


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
