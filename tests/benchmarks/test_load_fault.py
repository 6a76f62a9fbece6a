"""The load-and-fault suite's pure parts (``benchmarks/load_fault.py``): the seeded workload plan, the canaries of each
class, the label check, the client's reading of vLLM's errors and the checks' verdicts on a made-up run."""

import itertools
import random
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

from fixtures import load_fault_canaries as C
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
def test_short_canaries_are_where_every_feature_is_lossless(profile):
    plans = C.short_canaries(profile, CORPUS)
    assert len(plans) == len(profile.canaries) and len({p.offset for p in plans}) == len(plans)
    assert [p.offset for p in plans] == [(k * 104729 + 7) % (CORPUS - n) for k, (n, _) in enumerate(profile.canaries)]
    for plan in plans:
        assert plan.greedy and plan.fault == "none" and plan.canary == "short"
        assert plan.prompt_tokens < profile.pflash_min_prompt  # PFlash leaves it whole
        assert plan.prompt_tokens + plan.max_tokens + P.DFLASH_DRAFTS < profile.pool_tokens  # never paged out
    with pytest.raises(AssertionError):  # past the pool: KVFlash would page it out
        C.short_canaries(replace(P.CPU, canaries=((500, 32),)), CORPUS)


@pytest.mark.parametrize("profile", [P.CPU, P.GPU], ids=["cpu", "gpu"])
def test_every_canary_class_reaches_the_feature_it_guards(profile):
    plans = C.reference_plans(profile, 0, CORPUS)
    assert {p.canary for p in plans} == set(C.CLASSES) - (set() if profile.kv_canaries else {"kv"})
    assert len({p.name for p in plans}) == len(plans) and plans == C.reference_plans(profile, 0, CORPUS)
    corpus = list(range(CORPUS))
    for plan in plans:
        assert plan.greedy and plan.fault == "none" and plan.name.startswith(f"{plan.canary}-")
        assert plan.prompt_tokens + plan.max_tokens + P.DFLASH_DRAFTS < profile.max_model_len
        assert len(P.prompt_ids(plan, corpus)) == plan.prompt_tokens and plan.offset + plan.prompt_tokens <= CORPUS
    by = {kind: [p for p in plans if p.canary == kind] for kind in C.CLASSES}
    for plan in by["long"]:  # several times the pool, opted out: KVFlash pages it out, within the host budget
        assert 3 * profile.pool_tokens <= plan.prompt_tokens <= 6 * profile.pool_tokens and not plan.pflash
        assert (plan.prompt_tokens + plan.max_tokens + P.DFLASH_DRAFTS - profile.pool_tokens) / 64 < profile.host_chunks
    for plan in by["pflash"]:  # eligible and long enough: PFlash compresses it
        assert plan.pflash and plan.prompt_tokens >= profile.pflash_min_prompt
    for plan in by["drafting"]:  # a passage twice, then its first tokens: the output repeats the passage
        ids, n = P.prompt_ids(plan, corpus), plan.passage
        assert ids[:n] == ids[n:2 * n] == corpus[plan.offset:plan.offset + n] and ids[2 * n:] == ids[:C.LEAD_TOKENS]
        assert plan.max_tokens <= n - C.LEAD_TOKENS and plan.prompt_tokens < profile.pflash_min_prompt
        assert plan.prompt_tokens + plan.max_tokens + P.DFLASH_DRAFTS < profile.pool_tokens  # DFlash alone acts
    assert len(by["long"]) == len(by["pflash"]) == len(by["drafting"]) == 3
    # The kv canaries are the first requests of each KV round, greedy, with the round's prompts and outputs.
    kv_rounds = [k for k, (_, kind) in enumerate(P.pressure_rounds(profile)) if kind == "kv"]
    profile = replace(profile, kv_canaries=profile.kv_canaries or 2)  # the CPU profile has none: as if it had 2
    by["kv"] = [p for p in C.reference_plans(profile, 0, CORPUS) if p.canary == "kv"]
    assert 0 < profile.kv_canaries <= profile.kv_round_requests
    assert len(by["kv"]) == len(kv_rounds) * profile.kv_canaries
    for k in kv_rounds:
        round_ = P.kv_round_requests(profile, 0, k, CORPUS)
        assert [p for p in round_ if p.canary] == [p for p in by["kv"] if p.number // 100 == k]
        assert [p.canary for p in round_[:profile.kv_canaries]] == ["kv"] * profile.kv_canaries
        assert not any(p.canary for p in round_[profile.kv_canaries:])
    # Marking them changes no prompt or output of the round: the round's arithmetic holds.
    unmarked = P.kv_round_requests(replace(profile, kv_canaries=0), 0, kv_rounds[0], CORPUS)
    assert [(p.prompt_tokens, p.offset, p.max_tokens) for p in unmarked] == [
        (p.prompt_tokens, p.offset, p.max_tokens) for p in P.kv_round_requests(profile, 0, kv_rounds[0], CORPUS)]
    # The canary streams send every class but kv in turn, each class early.
    turns = C.rotation(profile, CORPUS)
    assert [p.canary for p in turns[:4]] == ["short", "long", "pflash", "drafting"]
    assert sorted(p.name for p in turns) == sorted(p.name for p in plans if p.canary != "kv")


def test_canaries_outside_their_class_are_refused():
    for changes in ({"long_canaries": ((1000, 16),)}, {"long_canaries": ((3500, 16),)},  # under 3x, over 6x the pool
                    {"pflash_canaries": ((900, 16),)},  # below PFlash's minimum
                    {"drafting_canaries": ((240, 48),)},  # past the pool
                    {"drafting_canaries": ((60, 48),)}):  # an output longer than the rest of the passage
        with pytest.raises(AssertionError):
            C.reference_plans(replace(P.CPU, **changes), 0, CORPUS)


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
    body = request_body(C.short_canaries(P.CPU, CORPUS)[0], [5] * 40, "t", logprobs=True)
    assert body["stream"] and body["logprobs"] == 2 and body["temperature"] == 0.0 and "vllm_xargs" not in body
    body = request_body(C.long_canaries(P.CPU, CORPUS)[0], [5] * 1600, "t", logprobs=True)
    assert body["vllm_xargs"] == {"luce_pflash": "off"} and body["stream_options"] == {"include_usage": True}


IDLE = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n"


def pflash_usage(plan, kept=None, outcome="compressed", digest=None):
    kept = int(plan.prompt_tokens * 0.3) if kept is None else kept
    field = {"prompt_tokens_sent": plan.prompt_tokens, "prompt_tokens_kept": kept, "outcome": outcome}
    return {**field, "kept_digest": digest or f"{plan.prompt_tokens:016x}"} if outcome == "compressed" else field


def made_up_run(**changes):
    """A run that passes every check; ``changes`` break one thing each. Its canaries: every class, the kv ones of
    the full CPU profile's KV round."""
    profile = replace(P.CPU.scaled(seconds=10), kv_canaries=2)
    canary = C.reference_plans(replace(P.CPU, kv_canaries=2), 0, CORPUS)
    reference = [Outcome(p, status="completed", text=f"out {p.name}", tokens=["out", f" {p.name}"],
                         top2=[[-0.1, -3.0], [-0.1, -3.0]], gate_speculating=1.0 if p.canary == "drafting" else None,
                         luce_pflash=pflash_usage(p) if p.canary == "pflash" else None) for p in canary]
    under_load = [Outcome(p, status="completed", text=f"out {p.name}",
                          luce_pflash=pflash_usage(p) if p.canary == "pflash" else None) for p in canary]
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
           "canaries": under_load, "reference": reference, "reference_plans": [p.name for p in canary],
           "finished": True, "ledger_before": {"pinned": 0},
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
    for counter, name in (("host_budget_drops", "no_chunk_dropped_or_lost"), ("lost_chunks", "no_chunk_dropped_or_lost"),
                          ("host_over_reserved_chunks", "host_memory_within_reservations"),
                          ("page_mismatches", "paged_bytes_read_back_as_written")):
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


def canary(run, name):
    return next(o for o in run["canaries"] if o.plan.name == name)


def test_canaries_are_compared_class_by_class():
    summary, checks, _ = evaluate(made_up_run(), log="")
    table = summary["canaries"]
    assert set(table) == {*C.CLASSES, "total"} and table["total"]["mismatches"] == 0
    assert table["short"] == {"references": 6, "under_load": 6, "greedy_compared": 6, "identical": 6, "near_tie": 0,
                              "mismatches": 0}
    assert table["kv"]["greedy_compared"] == 2 and table["pflash"]["kept_as_reference"] == 3
    assert table["drafting"]["reference_speculating_at_end"] == 3
    assert table["total"]["greedy_compared"] == len(C.reference_plans(replace(P.CPU, kv_canaries=2), 0, CORPUS))
    assert "long: 3 identical, 0 first differ at a near-tie, 0 mismatches of 3" in checks[
        "paged_canaries_equal_the_reference"]["detail"]
    assert "short: 6 identical" in checks["canaries_equal_the_reference"]["detail"]

    for name in ("short-canary2", "long-canary1", "pflash-canary0", "drafting-canary2", "kv-canary101"):
        run = made_up_run()
        canary(run, name).text = "something else"  # differs where the reference's top-2 gap is 2.9 nats
        summary, checks, details = evaluate(run, "")
        kind = name.split("-")[0]
        failing, other = ("paged_canaries_equal_the_reference", "canaries_equal_the_reference")[::1 if kind in (
            "long", "pflash") else -1]
        assert not checks[failing]["ok"] and checks[other]["ok"], name
        assert summary["canaries"][kind]["mismatches"] == 1 and summary["canaries"]["total"]["mismatches"] == 1
        assert f"{kind}: request {name}: differs at token 0" in checks[failing]["detail"]
        assert details["canary_mismatches"][0].startswith(f"{kind}: request {name}")

    run = made_up_run()  # a first difference where the reference's top two are within 0.25 nats: a near-tie
    reference = next(o for o in run["reference"] if o.plan.name == "long-canary0")
    reference.top2[1] = [-0.6, -0.7]
    canary(run, "long-canary0").text = "out something else"
    summary, checks, _ = evaluate(run, "")
    assert checks["paged_canaries_equal_the_reference"]["ok"] and summary["canaries"]["long"]["near_tie"] == 1


def test_a_class_that_was_never_compared_or_lost_a_reference_fails():
    run = made_up_run()
    run["canaries"] = [o for o in run["canaries"] if o.plan.canary != "drafting"]
    failed = evaluate(run, "")[1]["canaries_equal_the_reference"]
    assert not failed["ok"] and "drafting: no run under load compared" in failed["detail"]
    run = made_up_run()
    run["reference"] = [o for o in run["reference"] if o.plan.name != "long-canary2"]
    failed = evaluate(run, "")[1]["paged_canaries_equal_the_reference"]
    assert not failed["ok"] and "reference of long-canary2 not completed" in failed["detail"]
    run = made_up_run()
    next(o for o in run["reference"] if o.plan.canary == "pflash").luce_pflash["outcome"] = "deadline"
    assert "references not all compressed" in evaluate(run, "")[1]["paged_canaries_equal_the_reference"]["detail"]


def test_a_pflash_run_shed_under_load_is_counted_apart_not_compared():
    run = made_up_run()
    shed = canary(run, "pflash-canary1")
    shed.luce_pflash, shed.text = pflash_usage(shed.plan, kept=shed.plan.prompt_tokens, outcome="deadline"), "other"
    summary, checks, _ = evaluate(run, "")
    row = summary["canaries"]["pflash"]
    assert checks["paged_canaries_equal_the_reference"]["ok"] and row["greedy_compared"] == 2
    assert row["kept_as_reference"] == 2 and row["kept_differs"] == [
        f"pflash-canary1: kept 1700 (deadline), reference {int(1700 * 0.3)}"]


def test_a_pflash_run_that_kept_other_tokens_under_load_fails_and_is_not_compared():
    run = made_up_run()
    other = canary(run, "pflash-canary2")
    other.luce_pflash, other.text = pflash_usage(other.plan, digest="0123456789abcdef"), "other"
    summary, checks, _ = evaluate(run, "")
    failed = checks["paged_canaries_equal_the_reference"]
    assert not failed["ok"] and "pflash-canary2 kept other tokens under load" in failed["detail"], failed
    assert summary["canaries"]["pflash"]["mismatches"] == 0  # another prompt: not compared


def test_vllm_alone_runs_without_the_plugin_and_keeps_only_vllm_s_own_checks(tmp_path):
    """``--without luce``: vLLM alone under the same load, to measure its own canary variance; the checks of what only
    vllm-luce does are left out, the others still fail as they should."""
    from benchmarks.load_fault import main_profile, server_args
    from fixtures.load_fault_checks import LUCE_ONLY

    alone = main_profile(["--scale", "gpu", "--json", "x", "--without", "luce"])
    assert not (alone.luce or alone.dflash or alone.pflash)
    args = server_args(alone, tmp_path / "ledger")
    assert "--speculative-model" not in args and "luce" not in args[args.index("--additional-config") + 1]
    assert main_profile(["--scale", "cpu", "--json", "x"]).luce
    luce_free = made_up_run(profile_obj=replace(made_up_run()["profile_obj"], luce=False, dflash=False, pflash=False))
    luce_free["after"] = luce_free["after"].replace('outcome="cancelled"} 1', 'outcome="cancelled"} 0')
    summary, checks, _ = evaluate(luce_free, "")
    assert not set(LUCE_ONLY) & set(checks) and all(c["ok"] for c in checks.values()), checks
    assert not evaluate({**luce_free, "before": luce_free["after"]}, "")[1]["vllm_preempted"]["ok"]


def test_a_chosen_kvflash_policy_reaches_the_server_and_the_default_sends_none(tmp_path):
    """``--kvflash-policy lru``: the one change that rules the policy's scores in or out of a paged canary's change
    (LRU chooses by position alone); without it the server runs KVFlash's default policy."""
    import json

    from benchmarks.load_fault import main_profile, server_args

    def kvflash_of(argv):
        args = server_args(main_profile(["--scale", "gpu", "--json", "x", *argv]), tmp_path / "ledger")
        return json.loads(args[args.index("--additional-config") + 1])["luce"]["kvflash"]

    assert kvflash_of(["--kvflash-policy", "lru"])["policy"] == "lru"
    assert "policy" not in kvflash_of([])
    with pytest.raises(SystemExit):
        main_profile(["--scale", "gpu", "--json", "x", "--kvflash-policy", "attention"])  # SFI only


@pytest.mark.parametrize("name", ["long-canary1", "pflash-canary2"])
def test_a_paged_canary_that_parted_after_a_near_tied_chunk_choice_is_counted_apart(name):
    """With the chunk choices in the server log (``luce.kvflash.log_choices``): a paged canary that parts from its
    reference after its choices parted at a call within ``CHOICE_TIE`` is counted apart, not a mismatch; one that
    parts with the same choices before its first differing token, after a clear-cut choice, or with no choices logged
    stays a mismatch, each with what its choices showed."""
    def parted(reference_choices, run_choices, engine_suffix="-0-ab12cd34"):
        run = made_up_run()
        ref, mine = next(o for o in run["reference"] if o.plan.name == name), canary(run, name)
        ref.response_id, mine.response_id, mine.text = "cmpl-ref", "cmpl-load", "something else"  # parts at token 0
        log = "\n".join(f"(EngineCore pid=1) INFO x: KVFlash chunk choices of request {rid}{engine_suffix}: "
                        + " ".join(f"{p}:{d}:{m}" for p, d, m in entries)
                        for rid, entries in (("cmpl-ref", reference_choices), ("cmpl-load", run_choices)) if entries)
        summary, checks, _ = evaluate(run, log)
        return summary["canaries"][name.split("-")[0]], checks["paged_canaries_equal_the_reference"]

    ours = [(0, "aa", 0.5), (300, "bb", 0.01)]  # both runs decide at 300, before the prompt's end
    row, check = parted(ours, [(0, "aa", 0.5), (300, "cc", 0.02)])
    assert check["ok"] and row["choice_near_tie"] == 1 and row["mismatches"] == 0, check
    assert "1 after a near-tied chunk choice" in check["detail"] and "part at position 300" in check["detail"]
    clear = [(0, "aa", 0.5), (300, "bb", 0.2)]
    for mine, theirs, why in ((ours, ours, "the same chunk choices"),
                              (clear, [(0, "aa", 0.5), (300, "cc", 0.2)], "part at position 300 (closest call 0.2000)"),
                              (ours, None, "no chunk choices logged")):
        row, check = parted(mine, theirs)
        assert not check["ok"] and row["mismatches"] == 1 and row["choice_near_tie"] == 0, (why, check)
        assert why in row["choice_notes"][0] and row["choice_notes"][0].startswith(name), row
    row, check = parted(ours + [(5000, "dd", 0.0)], ours + [(5000, "ee", 0.0)])  # a tie after the parting token
    assert not check["ok"] and "the same chunk choices" in row["choice_notes"][0]
