"""Load test through `vllm serve` + `openai` (``benchmarks/load_test.py``): 300 requests over 32 concurrent
streams, short and long prompts, greedy and sampled, on the trained Qwen3.6-architecture model.

Three servers run the same workload one after another: features off (the reference), KVFlash + PFlash,
and all three features (DFlash too). Every request of every server completes without error; greedy
requests where the features are lossless (short prompts: the KVFlash pool covers them and PFlash leaves
them alone) equal the reference, up to bf16 near-ties; host memory grows at most 5% after warm-up;
`/metrics` shows each feature at work and, once idle, no KVFlash pager or host page held.

DFlash is lossless too, so the all-features server is held to the same bound. Two bugs broke that
until 2026-11-21: vLLM 0.32's CPU expand kernel corrupted every mixed greedy and sampled batch's
verification (patches/cpu_expand_kernel.py), and held drafter writes of finished requests landed in new
requests' Gated DeltaNet state (spec_decode/deferred_context.py).
"""

from __future__ import annotations

import pytest

from benchmarks import load_test as L

pytestmark = pytest.mark.e2e

REQUESTS, STREAMS = 300, 32
WARMUP = 60  # requests done before the first memory sample


@pytest.fixture(scope="module")
def items():
    return L.workload(REQUESTS)


@pytest.fixture(scope="module")
def runs(items, tmp_path_factory):
    work = tmp_path_factory.mktemp("load")
    kv_pf = [a for a in L.luce_args() if a not in ("--speculative-model", "dflash")]
    out = {}
    for name, extra, logprobs in (("off", [], True), ("kvflash+pflash", kv_pf, False), ("all", L.luce_args(), False)):
        out[name] = L.serve_and_load(work, name, extra, items, STREAMS, logprobs, warmup=WARMUP)
        print(f"{name}: {out[name]['summary']}; RSS {out[name]['rss']}")
    return out


def assert_every_stream_completes(run: dict, requests: int) -> None:
    """Every request returned, without error, all its tokens, and the server logged no traceback."""
    results = run["results"]
    assert len(results) == requests
    assert [r.error for r in results if r.error] == []
    assert all(r.completion_tokens == L.MAX_TOKENS[r.item.kind] for r in results)
    assert "Traceback" not in run["log"]


@pytest.mark.parametrize("name", ["off", "kvflash+pflash", "all"])
def test_every_stream_completes(runs, name):
    assert_every_stream_completes(runs[name], REQUESTS)


@pytest.mark.parametrize("name", ["kvflash+pflash", "all"])
def test_host_memory_growth_after_warmup_is_at_most_5_percent(runs, name):
    rss = runs[name]["rss"]
    assert rss["end"] <= 1.05 * rss["after_warmup"], rss


@pytest.mark.parametrize("name,identical", [("kvflash+pflash", 0.9), ("all", 0.8)])
def test_greedy_outputs_are_kept_where_the_features_are_lossless(runs, name, identical):
    """Every greedy output equals the reference or first differs at a near-tie, but for at most 1%.

    Measured 2026-11-21 (KVFlash + PFlash): 149 of 150 identical or first differing at a near-tie; one
    (request 10) first differs at token 20 where the reference's top-2 gap is 4.4 nats. vLLM alone gives
    the same tokens under KVFlash's 320-token step budget (``scripts/repro_step_budget_divergence.py``), so
    at most 1% is allowed here, printed, and explained in docs/operations.md. DFlash adds no allowance.
    With DFlash, more first differences are near-ties (133 identical and 17 near-ties of 150): verification
    runs 16-token forwards, whose bf16 sums differ from a 1-token decode's."""
    cmp = L.compare_greedy(runs[name]["results"], runs["off"]["results"])
    print(f"{name} vs off:", {k: v for k, v in cmp.items() if k != "mismatches"}, cmp["mismatches"])
    assert cmp["greedy_compared"] >= 100
    assert len(cmp["mismatches"]) <= 0.01 * cmp["greedy_compared"], cmp["mismatches"]
    assert cmp["identical"] >= identical * cmp["greedy_compared"], cmp


def test_metrics_show_every_feature_at_work_and_nothing_held_when_idle(runs):
    m = runs["all"]["metrics"]
    long_prompts = sum(1 for r in runs["all"]["results"] if r.item.kind == "long")
    assert L.metric(m, "vllm:luce_pflash_prompts_total", outcome="compressed") >= 0.9 * long_prompts
    assert L.metric(m, "vllm:luce_pflash_kept_tokens_total") < 0.5 * L.metric(m, "vllm:luce_pflash_prompt_tokens_total")
    assert L.metric(m, "vllm:luce_dflash_drafts_total") > 0
    assert L.metric(m, "vllm:luce_dflash_gate_steps_total", mode="spec") > 0
    assert L.metric(m, "vllm:luce_kvflash_page_outs_total") > 0
    assert L.metric(m, "vllm:luce_kvflash_reselections_total") > 0
    for idle in ("vllm:luce_kvflash_requests", "vllm:luce_kvflash_host_bytes", "vllm:num_requests_running"):
        assert L.metric(m, idle) == 0, idle
    off = runs["off"]["metrics"]
    assert "vllm:luce_" not in off  # features off: vllm-luce reports nothing
