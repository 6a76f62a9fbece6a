"""The load test at tensor parallel size 2 (``benchmarks/load_test.py --tp 2``): the same workload, cut to
96 requests over 32 streams, against a features-off server and an all-features server, both TP=2.

Every feature runs across the ranks: DFlash's drafter and gate, PFlash's scorer on rank 0, KVFlash on
both ranks (its `/metrics` carry a ``rank`` label, and the two ranks' decisions must be equal). The CPU
backend runs TP=2 here with one core per rank (``VLLM_CPU_OMP_THREADS_BIND="0|1"``).
"""

from __future__ import annotations

import pytest

from fixtures import serve_load as L
from tests.e2e.test_load import assert_every_stream_completes

pytestmark = pytest.mark.e2e

REQUESTS, STREAMS, TP = 96, 32, 2
WARMUP = 20


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    items = L.workload(REQUESTS)
    work = tmp_path_factory.mktemp("load_tp")
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    try:
        out = {}
        # The reference runs the whole workload here, unlike at TP=1: with only the compared requests one run
        # had a second mismatch (request 18, a 1.7-nat gap) beside vLLM's own request 10, one over the bound.
        for name, extra, logprobs in (("off", L.reference_args(TP), True), ("all", L.luce_args(TP), False)):
            out[name] = L.serve_and_load(work, name, extra, items, STREAMS, logprobs, warmup=WARMUP, alone=logprobs)
            print(f"TP={TP} {name}: {out[name]['summary']}; RSS {out[name]['rss']}")
    finally:
        mp.undo()
    return out


TIE_NATS_TP2 = 0.5  # a near-tie at TP=2 (the test below)


@pytest.mark.parametrize("name", ["off", "all"])
def test_every_stream_completes(runs, name):
    assert_every_stream_completes(runs[name], REQUESTS)


def test_greedy_outputs_are_kept_where_the_features_are_lossless(runs):
    """The bound of the TP=1 test (vLLM's own chunk-boundary divergence): here one of 48. Near-ties are not
    counted against it, up to TIE_NATS_TP2: TP=2 sums each layer's halves in another order, and runs of this test
    met first differences at 0.31 and 0.5 nats on short requests no feature changes (inside the pool, below
    PFlash's minimum) beside vLLM's own flips under load (docs/operations.md has the counts of a run)."""
    cmp = L.compare_greedy(runs["all"]["results"], runs["off"]["results"], runs["off"]["results_alone"],
                           tie_nats=TIE_NATS_TP2)
    print("all vs off:", {k: v for k, v in cmp.items() if k != "mismatches"}, cmp["mismatches"])
    assert cmp["greedy_compared"] >= 30
    assert len(cmp["mismatches"]) <= L.allowed_mismatches(cmp["greedy_compared"]), cmp["mismatches"]
    assert cmp["fragile"] <= 0.1 * cmp["greedy_compared"], cmp  # vLLM's own load variance stays rare


def test_host_memory_growth_after_warmup_is_at_most_5_percent(runs):
    rss = runs["all"]["rss"]
    assert rss["end"] <= 1.05 * rss["after_warmup"], rss


def test_every_feature_works_across_the_ranks(runs):
    m = runs["all"]["metrics"]
    assert L.metric(m, "vllm:luce_dflash_drafts_total") > 0
    assert L.metric(m, "vllm:luce_dflash_gate_steps_total", mode="spec") > 0
    assert L.metric(m, "vllm:luce_pflash_prompts_total", outcome="compressed") > 0
    for name in ("vllm:luce_kvflash_page_outs_total", "vllm:luce_kvflash_reselections_total"):
        per_rank = [L.metric(m, name, rank=str(r)) for r in range(TP)]
        assert per_rank[0] > 0 and per_rank == [per_rank[0]] * TP, (name, per_rank)
