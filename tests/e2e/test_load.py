"""Load test through `vllm serve` + `openai` (``benchmarks/load_test.py``): the workload's first 120 requests over 32
concurrent streams, short and long prompts, greedy and sampled, on the trained Qwen3.6-architecture model.

Two servers run one after another: features off (the reference) and all three features. The features server
runs all 120; the reference runs only the requests the comparison reads (``L.compared``: the greedy short
ones). Every request completes without error; greedy requests where the features are lossless
(short prompts: the KVFlash pool covers them and PFlash leaves them alone) equal the reference, up to bf16
near-ties; host memory grows at most 5% after warm-up; `/metrics` shows each feature at work and, once idle,
no KVFlash pager or host page held. The KVFlash + PFlash server that measures what DFlash's gate costs under
this load runs in the benchmark (``python -m benchmarks.load_test --kvflash-pflash``), not here: CI's 30
minutes do not hold it.

DFlash is lossless too, so the all-features server is held to the same bound. That needs
patches/cpu_expand_kernel.py (vLLM 0.32's CPU expand kernel corrupts the verification of every batch that mixes
greedy and sampled requests) and no drafter write outliving its request (one would land in a new request's Gated
DeltaNet state; tests/e2e/test_dflash_gate.py).
"""

from __future__ import annotations

import pytest

from fixtures import serve_load as L

pytestmark = pytest.mark.e2e

REQUESTS, STREAMS = 120, 32  # the benchmark runs 300; CI's 30 minutes hold 120 beside everything else
WARMUP = 24  # requests done before the first memory sample


@pytest.fixture(scope="module")
def items():
    return L.workload(REQUESTS)


@pytest.fixture(scope="module")
def runs(items, tmp_path_factory):
    work = tmp_path_factory.mktemp("load")
    reference = [item for item in items if L.compared(item)]
    out = {}
    for name, extra, subset in (("off", L.reference_args(), reference), ("all", L.luce_args(), items)):
        out[name] = L.serve_and_load(work, name, extra, subset, STREAMS, name == "off", warmup=WARMUP,
                                     alone=name == "off")
        out[name]["requests"] = len(subset)
        print(f"{name}: {len(subset)} requests, {out[name]['summary']}; RSS {out[name]['rss']}")
    return out


def assert_every_stream_completes(run: dict, requests: int) -> None:
    """Every request returned, without error, all its tokens, and the server logged no traceback."""
    results = run["results"]
    assert len(results) == requests
    errors = [f"request {r.item.index}: {r.error}" for r in results if r.error]
    assert errors == [], "\n".join([*errors, "server log tail:", run["log"][-3000:]])
    assert all(r.completion_tokens == L.MAX_TOKENS[r.item.kind] for r in results)
    assert "Traceback" not in run["log"]


@pytest.mark.parametrize("name", ["off", "all"])
def test_every_stream_completes(runs, name):
    assert_every_stream_completes(runs[name], runs[name]["requests"])


def test_host_memory_growth_after_warmup_is_at_most_5_percent(runs):
    rss = runs["all"]["rss"]
    assert rss["end"] <= 1.05 * rss["after_warmup"], rss


def test_greedy_outputs_are_kept_where_the_features_are_lossless(runs):
    """Every greedy output equals the reference or first differs at a near-tie, but for at most 2%.

    The reference runs at the features' 320-token step budget (``L.reference_args``): under vLLM's default
    budget it chunks prompts elsewhere, and vLLM alone then changes greedy tokens at top-2 gaps of up to 4.4 nats
    (``scripts/repro_step_budget_divergence.py``): the features' outputs would part from it far from near-ties.
    Chunk boundaries still follow each server's timing, hence the 2% (``L.allowed_mismatches``). With the matched
    reference nearly every greedy output is identical and the rest first differ at near-ties (docs/operations.md
    has the counts).
    Verification runs 16-token forwards, whose bf16 sums differ from a 1-token decode's, so DFlash adds
    near-ties, not mismatches."""
    cmp = L.compare_greedy(runs["all"]["results"], runs["off"]["results"], runs["off"]["results_alone"])
    print("all vs off:", {k: v for k, v in cmp.items() if k != "mismatches"}, cmp["mismatches"])
    assert cmp["greedy_compared"] >= 0.4 * REQUESTS
    assert len(cmp["mismatches"]) <= L.allowed_mismatches(cmp["greedy_compared"]), cmp["mismatches"]
    assert cmp["fragile"] <= 0.1 * cmp["greedy_compared"], cmp  # vLLM's own load variance stays rare
    assert cmp["identical"] >= 0.8 * cmp["greedy_compared"], cmp


def test_metrics_show_every_feature_at_work_and_nothing_held_when_idle(runs):
    m = runs["all"]["metrics"]
    long_prompts = sum(1 for r in runs["all"]["results"] if r.item.kind == "long")
    assert L.metric(m, "vllm:luce_pflash_prompts_total", outcome="compressed") >= 0.9 * long_prompts
    # keep_ratio 0.3 plus the anchor and recent chunks PFlash always keeps, a larger share of a shorter prompt: the
    # first 120 requests' compressed prompts kept 0.51 of their 58,770 tokens
    assert L.metric(m, "vllm:luce_pflash_kept_tokens_total") < 0.6 * L.metric(m, "vllm:luce_pflash_prompt_tokens_total")
    assert L.metric(m, "vllm:luce_dflash_drafts_total") > 0
    assert L.metric(m, "vllm:luce_dflash_gate_steps_total", mode="spec") > 0
    assert L.metric(m, "vllm:luce_kvflash_page_outs_total") > 0
    assert L.metric(m, "vllm:luce_kvflash_reselections_total") > 0
    for idle in ("vllm:luce_kvflash_requests", "vllm:luce_kvflash_host_bytes", "vllm:num_requests_running"):
        assert L.metric(m, idle) == 0, idle
    off = runs["off"]["metrics"]
    assert "vllm:luce_" not in off  # features off: vllm-luce reports nothing
