"""The load-and-fault suite's pure parts (``benchmarks/load_fault.py``): the seeded workload plan, the label check, the
client's reading of vLLM's errors and the checks' verdicts on a made-up run."""

import itertools
import random
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fixtures import load_fault_plan as P
from fixtures.load_fault_checks import evaluate
from fixtures.load_fault_client import Outcome, error_message, request_body
from vllm_luce.metrics.catalog import PFLASH_OUTCOMES

CORPUS = 486_888  # held-out tokens of the trained model


@pytest.mark.parametrize("profile", [P.CPU, P.GPU], ids=["cpu", "gpu"])
def test_the_plan_is_seeded_and_each_fault_gets_the_prompt_its_phase_needs(profile):
    first = list(itertools.islice(P.stream_plan(profile, 7, 3, CORPUS), 400))
    assert first == list(itertools.islice(P.stream_plan(profile, 7, 3, CORPUS), 400))
    assert first != list(itertools.islice(P.stream_plan(profile, 7, 4, CORPUS), 400))
    for plan in first:
        assert profile.prompt_tokens[0] <= plan.prompt_tokens <= profile.prompt_tokens[1]
        assert plan.offset + plan.prompt_tokens <= CORPUS
        assert plan.prompt_tokens + plan.max_tokens + P.DFLASH_DRAFTS < profile.max_model_len
        if plan.fault == "scoring":  # long enough for PFlash to score it, and eligible
            assert plan.pflash and plan.prompt_tokens >= profile.pflash_min_prompt and plan.cut_after_s > 0
        if plan.fault == "prefill":  # opted out and past the pool: KVFlash pages it out while it prefills
            assert not plan.pflash and plan.prompt_tokens >= 2 * profile.pool_tokens and plan.cut_after_s > 0
        if plan.fault in ("decode", "verify"):
            assert plan.cut_after_events >= 2 and plan.max_tokens > plan.cut_after_events
        if plan.fault == "timeout":
            assert plan.cut_after_s > 0 and plan.cut_after_events == 0


def test_faults_greedy_and_opt_outs_come_in_their_shares():
    plans = list(itertools.islice(P.stream_plan(P.GPU, 0, 0, CORPUS), 5000))
    shares = Counter(p.fault for p in plans)
    for fault, weight in zip(P.FAULTS, P.FAULT_WEIGHTS):
        assert abs(shares[fault] / len(plans) - weight) < 0.02, (fault, shares)
    assert abs(sum(p.greedy for p in plans) / len(plans) - 0.5) < 0.03
    # Prompts are log-uniform: as many below the geometric middle as above it.
    middle = (P.GPU.prompt_tokens[0] * P.GPU.prompt_tokens[1]) ** 0.5
    none = [p for p in plans if p.fault == "none"]
    assert abs(sum(p.prompt_tokens < middle for p in none) / len(none) - 0.5) < 0.04


@pytest.mark.parametrize("profile", [P.CPU, P.GPU], ids=["cpu", "gpu"])
def test_canaries_are_where_every_feature_is_lossless(profile):
    plans = P.canaries(profile, CORPUS)
    assert len(plans) == len(profile.canaries) and len({p.offset for p in plans}) == len(plans)
    for plan in plans:
        assert plan.greedy and plan.fault == "none"
        assert plan.prompt_tokens < profile.pflash_min_prompt  # PFlash leaves it whole
        assert plan.prompt_tokens + plan.max_tokens + P.DFLASH_DRAFTS < profile.pool_tokens  # never paged out
    with pytest.raises(AssertionError):  # past the pool: KVFlash would page it out
        P.canaries(replace(P.CPU, canaries=((500, 32),)), CORPUS)


def test_pressure_rounds_alternate_and_each_stream_sends_one_long_opted_out_prompt():
    assert P.pressure_rounds(P.CPU) == [(10.0, "host"), (30.0, "kv"), (50.0, "host")]
    assert [kind for _, kind in P.pressure_rounds(P.GPU)] == ["host", "kv", "host", "kv"]
    assert P.pressure_rounds(P.CPU.scaled(seconds=15)) == [(10.0, "host")]
    hosts = [P.host_round_request(P.GPU, 0, s, 2, CORPUS) for s in range(64)]
    assert all(not h.pflash and h.fault == "none" and h.pressure == "host" for h in hosts)
    assert all(P.GPU.host_round_tokens[0] <= h.prompt_tokens <= P.GPU.host_round_tokens[1] for h in hosts)
    # Together they page out far more than the host budget (1 KiB a token beyond the pool).
    assert sum(h.prompt_tokens - P.GPU.pool_tokens for h in hosts) * 1024 > 4 * P.GPU.host_bytes
    kv = P.kv_round_requests(P.CPU, 0, 1, CORPUS)
    assert kv == P.kv_round_requests(P.CPU, 0, 1, CORPUS) and len(kv) == P.CPU.kv_round_requests
    assert len({p.name for p in kv + P.kv_round_requests(P.CPU, 0, 3, CORPUS)}) == 2 * len(kv)


SCRAPE = """# HELP vllm:luce_pflash_prompts_total Prompts seen by PFlash
vllm:luce_pflash_prompts_total{model_name="t",outcome="compressed"} 3.0
vllm:luce_pflash_prompts_created{model_name="t",outcome="compressed"} 1.7e9
vllm:luce_kvflash_page_outs_total{model_name="t",rank="0"} 12.0
vllm:luce_dflash_gate_rate_tokens_per_second{batch_le="8",mode="spec",model_name="t"} 50.0
vllm:luce_dflash_accepted_tokens_per_pos_total{model_name="t",position="3"} 2.0
vllm:luce_kvflash_held_back_steps_total{engine="0",model_name="t"} 4.0
vllm:num_requests_running{model_name="t"} 0.0
"""


def test_label_values_come_from_fixed_sets():
    fixed = P.fixed_label_values("t", max_num_seqs=64)
    assert fixed["batch_le"] == {"0", "1", "2", "4", "8", "16", "32", "64"}
    assert fixed["position"] == {str(i) for i in range(15)} and fixed["outcome"] == set(PFLASH_OUTCOMES)
    series = P.luce_series(SCRAPE)
    assert len(series) == 5  # a counter's _created sample is its series; vLLM's own metrics are not luce's
    assert P.unbounded_labels(series, fixed) == []
    grown = P.luce_series(SCRAPE + 'vllm:luce_pflash_prompts_total{model_name="t",outcome="req-81c2"} 1.0\n'
                          + 'vllm:luce_kvflash_requests{model_name="t",rank="0",request="7"} 1.0\n'
                          + 'vllm:luce_dflash_gate_speedup{batch_le="128",model_name="t"} 1.0\n'
                          + 'vllm:luce_made_up_total{model_name="t"} 1.0\n')
    problems = P.unbounded_labels(grown, fixed)
    assert len(problems) == 4, problems
    assert any("'req-81c2' is outside" in p for p in problems) and any("label request='7'" in p for p in problems)
    assert any("'128' is outside" in p for p in problems) and any("not in vllm_luce" in p for p in problems)


def test_vllm_errors_are_read_in_both_shapes_and_bodies_carry_the_plan():
    assert error_message('{"error": {"message": "too long", "type": "BadRequestError", "code": 400}}') == \
        (400, "too long")
    assert error_message('{"object": "error", "message": "boom", "code": 500}') == (500, "boom")
    assert error_message("not json")[0] is None
    plan = P.RequestPlan(0, 0, "timeout", 100, 0, greedy=False, pflash=False, max_tokens=64, cut_after_s=1.0)
    body = request_body(plan, [5] * 100, "t", logprobs=False)
    assert "stream" not in body and body["vllm_xargs"] == {"luce_pflash": "off"} and body["temperature"] > 0
    body = request_body(P.canaries(P.CPU, CORPUS)[0], [5] * 40, "t", logprobs=True)
    assert body["stream"] and body["logprobs"] == 2 and body["temperature"] == 0.0 and "vllm_xargs" not in body


IDLE = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"


def made_up_run(**changes):
    """A run that passes every check; ``changes`` break one thing each."""
    profile = P.CPU.scaled(seconds=10)
    canary = P.canaries(profile, CORPUS)
    reference = [Outcome(p, status="completed", text=f"out {p.number}", tokens=["out", f" {p.number}"],
                         top2=[[-0.1, -3.0], [-0.1, -3.0]]) for p in canary]
    under_load = [Outcome(p, status="completed", text=f"out {p.number}") for p in canary]
    rng = random.Random(0)
    outcomes = []
    for fault in P.FAULTS:
        plan = next(p for p in P.stream_plan(profile, 0, 0, CORPUS) if p.fault == fault)
        outcomes.append(Outcome(plan, status="completed" if fault == "none" else "aborted", started=rng.random()))
    before = IDLE + "vllm:num_preemptions_total 0\nvllm:luce_kvflash_held_back_steps_total 4\n"
    after = (IDLE + "vllm:num_preemptions_total 3\n" + 'vllm:luce_pflash_prompts_total{outcome="cancelled"} 1\n'
             + SCRAPE.replace('held_back_steps_total{engine="0",model_name="t"} 4.0', "held_back_steps_total 9"))
    monitor = SimpleNamespace(samples=[{"t": 1.0, "health": 200, "alive": True}], health_failures=[],
                              halfway_text=SCRAPE)
    run = {"profile_obj": profile, "monitor": monitor, "before": before, "after": after, "outcomes": outcomes,
           "canaries": under_load, "reference": reference, "finished": True, "ledger_before": {"pinned": 0},
           "ledger_after": {"pinned": 0, "pageable": 0}}
    run.update(changes)
    return run


def test_a_clean_run_passes_and_each_broken_promise_fails_its_check():
    summary, checks, _ = evaluate(made_up_run(), log="")
    assert all(c["ok"] for c in checks.values()), {k: c for k, c in checks.items() if not c["ok"]}
    assert summary["faults"]["scoring"]["aborted"] == 1 and summary["errors"] == 0

    run = made_up_run()
    run["outcomes"][0].status, run["outcomes"][0].error = "failed", "HTTP 500: engine dead"
    assert not evaluate(run, "")[1]["every_request_completed_or_refused_clearly"]["ok"]
    run = made_up_run()
    run["canaries"][2].text = "something else"  # differs where the reference's top-2 gap is 2.9 nats
    assert not evaluate(run, "")[1]["canaries_equal_the_reference"]["ok"]
    for counter, name in (("host_budget_drops", "no_chunk_dropped_or_lost"), ("lost_chunks", "no_chunk_dropped_or_lost"),
                          ("host_over_reserved_chunks", "host_memory_within_reservations")):
        run = made_up_run(after=made_up_run()["after"] + f'vllm:luce_kvflash_{counter}_total{{rank="0"}} 2\n')
        assert not evaluate(run, "")[1][name]["ok"], counter
    traceback = ("INFO step\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
                 "KeyError: 7\nINFO next\n")
    failed = evaluate(made_up_run(), traceback)[1]["no_traceback_in_the_log"]
    assert not failed["ok"] and "KeyError: 7" in failed["detail"]
    failed_pass = made_up_run(after=made_up_run()["after"] + 'vllm:luce_pflash_prompts_total{outcome="failed"} 1\n')
    assert not evaluate(failed_pass, "")[1]["no_pflash_pass_failed"]["ok"]
    run = made_up_run(after=made_up_run()["after"] + 'vllm:luce_kvflash_host_bytes{rank="0"} 65536\n')
    assert not evaluate(run, "")[1]["idle_state"]["ok"]
    run = made_up_run(ledger_after={"pinned": 4096, "pageable": 0})
    assert not evaluate(run, "")[1]["idle_state"]["ok"]
    assert not evaluate(made_up_run(), "EngineCore encountered a fatal error")[1]["server_never_died"]["ok"]
    assert not evaluate(made_up_run(before=made_up_run()["after"]), "")[1]["vllm_preempted"]["ok"]
    run = made_up_run()
    run["outcomes"] = [o for o in run["outcomes"] if o.plan.fault != "verify"]
    assert not evaluate(run, "")[1]["every_fault_phase_hit"]["ok"]
    no_cancel = made_up_run(after=made_up_run()["after"].replace('outcome="cancelled"} 1', 'outcome="cancelled"} 0'))
    assert "no PFlash pass cancelled" in evaluate(no_cancel, "")[1]["every_fault_phase_hit"]["detail"]
    assert not evaluate(made_up_run(interrupted="SIGTERM", finished=False), "")[1]["ran_to_the_end"]["ok"]
