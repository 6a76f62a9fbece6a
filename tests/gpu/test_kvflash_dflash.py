"""DFlash beside KVFlash's paging leaves the requests that never page with vLLM alone's greedy answers (issue 67).

With DFlash gated and a KVFlash pool of 1,024 tokens, requests of the churn test that never page parted from vLLM
alone at clear top-1s on Model Runner V1 (docs/operations.md): KVFlash cuts a paged request's step at its decision
positions, which leaves a one-token row without drafts among the rows that verify drafts, and vLLM 0.26's Gated
DeltaNet layer then gave every verifying row behind it other rows' gates (``vllm_luce/vllm026/spec_rows_first_v1.py``
puts the verifying rows first). The gated V1 engine here must meet such steps, so the test can fail. The variants:
KVFlash alone, the host tier instead of lent KV blocks, the gate off, Model Runner V2, and a pool that pages nothing
as the control; every V1 engine with vllm-luce runs KVFlash's block-ownership audit (``luce.kvflash.audit``)."""

import dataclasses
import os

from tests.e2e.test_dflash_gate import SWITCHING
from tests.gpu.conftest import RUNNERS, keep_report, llm_args, parts, run_engine, side_by_side
from tests.gpu.test_dflash import IN_PROCESS, WIDE_NATS, churn_prompts, tp1_only

POOL = 1024
# LUCE_GPU_VARIANTS=both,both-v2: only those engines beside vLLM alone (a quicker run)
ONLY = [v for v in os.environ.get("LUCE_GPU_VARIANTS", "").split(",") if v]


SHARED = {"max_model_len": 8192, "dtype": "bfloat16", "max_num_batched_tokens": 512, "enable_prefix_caching": False}


def churn_specs(model) -> tuple[dict, dict]:
    """The churn test's 40 requests as engine specs without their ``llm`` arguments: vLLM alone's, and the gated
    DFlash engine's (the switching gate, KVFlash's totals, the count of steps that verify beside a one-token row)."""
    prompts, lengths = churn_prompts()
    base = {"model": str(model), "logprobs": 2, "prompts": prompts, "max_tokens": lengths, "aborts": []}
    return base, {**base, "gate": dataclasses.asdict(SWITCHING), "rpc": ["kvflash"], "mixed_steps": True}


def kvflash(dflash: dict | None = None, **settings) -> dict:
    """vllm-luce's settings: KVFlash's pool and audit with ``settings``, and DFlash's where given."""
    luce = {"kvflash": {"pool_tokens": POOL, "audit": True, **settings}}
    return {"luce": luce if dflash is None else {**luce, "dflash": dflash}}


@tp1_only
def test_requests_that_never_page_keep_vllm_alones_answers_beside_paging_and_drafts(trained_hybrid, tmp_path):
    base, gated = churn_specs(trained_hybrid)
    prompts, lengths = base["prompts"], base["max_tokens"]
    dflash = {"model": "dflash"}
    both = {**gated, "llm": llm_args(additional_config=kvflash(), **SHARED, speculative_config=dflash)}
    variants = {  # name: (model runner, engine spec); the audit reads V1's block tables only
        "both": ("v1", both),
        "both-host-tier": ("v1", {**gated, "llm": llm_args(additional_config=kvflash(gpu_cold=False), **SHARED,
                                                           speculative_config=dflash)}),
        "both-gate-off": ("v1", {**gated, "gate": None, "llm": llm_args(
            additional_config=kvflash(dflash={"gate": False}), **SHARED, speculative_config=dflash)}),
        "kvflash-only": ("v1", {**base, "rpc": ["kvflash"], "llm": llm_args(additional_config=kvflash(), **SHARED)}),
        "both-v2": ("v2", both),
        # the control: a pool no request outgrows pages nothing (no part on the H100), the audit and counts the same
        "both-no-paging": ("v1", {**gated, "llm": llm_args(additional_config=kvflash(pool_tokens=8192), **SHARED,
                                                           speculative_config=dflash)}),
    }
    variants = {name: variant for name, variant in variants.items() if not ONLY or name in ONLY}
    calls = [(run_engine, ({**base, "llm": llm_args(**SHARED)}, tmp_path),
              {"name": "vllm-alone", "plugins": False, **RUNNERS["v1"]})]
    calls += [(run_engine, (spec, tmp_path), {"name": name, **IN_PROCESS, **RUNNERS[runner]})
              for name, (runner, spec) in variants.items()]
    alone, *outs = side_by_side(*calls)
    short = [i for i, p in enumerate(prompts) if len(p) + lengths[i] <= POOL]  # never paged
    report = {"short": short}
    for name, out in zip(variants, outs):
        found = [p for p in parts(out, alone) if p["request"] in short]
        report[name] = {"parts": found, "wide": [p for p in found if p["gaps"][1] > WIDE_NATS],
                        "kvflash": out["kvflash"], "drafts": out["counters"].get("vllm:spec_decode_num_drafts", 0),
                        "preemptions": out["counters"].get("vllm:num_preemptions", 0),
                        "mixed_steps": out.get("mixed_steps")}
    keep_report("kvflash_dflash_bystanders_tp1", report)
    for name in variants:
        paged = sum(r["page_outs"] for r in report[name]["kvflash"])
        assert (paged == 0) if name == "both-no-paging" else (paged > 0), report[name]["kvflash"]
    audited = [name for name, (runner, _) in variants.items() if runner == "v1"]
    for name in audited:
        assert all(r.get("audit_steps", 0) > 0 for r in report[name]["kvflash"]), report[name]["kvflash"]
    audit = {name: [(r["audit_shared_blocks"], r["audit_stray_slots"]) for r in report[name]["kvflash"]]
             for name in audited}
    assert all(counts == (0, 0) for found in audit.values() for counts in found), audit
    # the steps that parted answers before the fix (vllm026/spec_rows_first_v1.py) happen here
    assert "both" not in variants or report["both"]["mixed_steps"] > 0, report["both"]
    assert not any(report[name]["wide"] for name in variants), {name: report[name]["wide"] for name in variants}
