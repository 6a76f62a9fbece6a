"""A request's greedy answer does not depend on other requests' aborts (issue 67): with DFlash gated and KVFlash's
cold tier lending free KV blocks, requests aborted mid-prefill and mid-decode leave every other request's tokens as
they are without them.

The load-and-fault suite's drafting canaries parted from their references beyond near-ties with every feature on and
aborts in the load, while vLLM alone under the same load parted only at near-ties (docs/operations.md); the suite
cannot say what changed them. Here the same engine runs the same bystanders three ways, in-process and step-counted
(nothing depends on timing): alone, beside long and short victims that run to the end, and beside the same victims
aborted at set steps."""

import dataclasses

from tests.e2e.test_dflash_gate import SWITCHING
from tests.gpu.conftest import RUNNERS, TP, keep_report, llm_args, parts, run_engine, side_by_side
from tests.gpu.test_dflash import IN_PROCESS, WIDE_NATS, churn_prompts, gate_steps, tp1_only

POOL = 1024  # KVFlash's pool: bystanders up to 1,500 tokens, victims of 3,000-6,000 page beyond it


def victims(seed: int = 68) -> tuple[list[list[int]], list[int], list[int]]:
    """Four long prompts (paged: their cold chunks go to lent KV blocks) and four short ones, each with a long answer
    and the engine step after which it is aborted: from inside its prefill to deep in its decode. Added before the
    bystanders, they run first and their slots and blocks go to bystanders as they are aborted."""
    import random

    from fixtures.trained import heldout_ids

    ids, rng = heldout_ids(), random.Random(seed)
    lengths = [rng.randint(3000, 5000) for _ in range(4)] + [rng.randint(100, 400) for _ in range(4)]
    prompts = []
    for n in lengths:
        start = rng.randrange(len(ids) - n)
        prompts.append(list(ids[start:start + n]))
    return prompts, [400] * len(prompts), [4, 30, 60, 120, 8, 40, 80, 160]


def bystanders_of(run: dict, first: int) -> dict:
    """An engine report cut to its requests from ``first`` on (the bystanders), as ``parts`` reads it."""
    return {key: run[key][first:] for key in ("tokens", "logprobs", "top_ids")}


def wide(found: list[dict]) -> list[dict]:
    """Parts where the second run (the reference) was sure of its token."""
    return [p for p in found if p["gaps"][1] > WIDE_NATS]


@tp1_only
def test_bystanders_keep_their_greedy_answers_beside_aborts(trained_hybrid, tmp_path):
    prompts, lengths = churn_prompts()
    extra, extra_lengths, abort_steps = victims()
    first = len(extra)  # the bystanders' place in a report with victims
    luce = {"luce": {"kvflash": {"pool_tokens": POOL}}}
    shared = {"max_model_len": 8192, "dtype": "bfloat16", "max_num_batched_tokens": 512, "enable_prefix_caching": False}
    spec = {"model": str(trained_hybrid), "logprobs": 2, "gate": dataclasses.asdict(SWITCHING), "rpc": ["kvflash"]}
    quiet = {**spec, "prompts": prompts, "max_tokens": lengths, "aborts": []}
    busy = {**spec, "prompts": extra + prompts, "max_tokens": extra_lengths + lengths, "aborts": []}
    aborting = {**busy, "aborts": [[i, s] for i, s in enumerate(abort_steps)]}
    llm = llm_args(additional_config=luce, **shared, speculative_config={"model": "dflash"})
    plain = {"model": str(trained_hybrid), "logprobs": 2, "prompts": prompts, "max_tokens": lengths, "aborts": [],
             "llm": llm_args(**shared)}
    env = {**IN_PROCESS, **RUNNERS["v1"]}
    # One feature at a time beside the same aborts: where the run with both parts, these say which one it takes.
    dflash_only = {**aborting, "rpc": [], "llm": llm_args(**shared, speculative_config={"model": "dflash"})}
    kvflash_only = {**aborting, "gate": None, "llm": llm_args(additional_config=luce, **shared)}
    alone, by_itself, beside, aborted, drafting, paging = side_by_side(
        (run_engine, (plain, tmp_path), {"name": "vllm-alone", "plugins": False, **RUNNERS["v1"]}),
        (run_engine, ({**quiet, "llm": llm}, tmp_path), {"name": "quiet", **env}),
        (run_engine, ({**busy, "llm": llm}, tmp_path), {"name": "busy", **env}),
        (run_engine, ({**aborting, "llm": llm}, tmp_path), {"name": "aborting", **env}),
        (run_engine, (dflash_only, tmp_path), {"name": "aborting-dflash-only", **env}),
        (run_engine, (kvflash_only, tmp_path), {"name": "aborting-kvflash-only", **env}))
    for run in (aborted, drafting, paging):
        assert len(run["aborted"]) == len(abort_steps), run["aborted"]
        assert sum(tokens > 0 for _, _, tokens in run["aborted"]) >= len(abort_steps) // 2, run["aborted"]
    assert all(sum(r["page_outs"] for r in out["kvflash"]) > 0 for out in (beside, aborted, paging)), beside["kvflash"]
    assert gate_steps(aborted)["spec"] > 0 and gate_steps(drafting)["spec"] > 0, aborted["counters"]
    reference, vllm = bystanders_of(by_itself, 0), bystanders_of(alone, 0)
    short = [i for i, p in enumerate(prompts) if len(p) + lengths[i] <= POOL]  # never paged: vLLM's answer

    def unpaged(found: list[dict]) -> list[dict]:
        return [p for p in found if p["request"] in short]

    report = {"aborted": aborted["aborted"], "short": short,
              "quiet_vs_alone": unpaged(parts(reference, vllm)),
              "busy_vs_quiet": parts(bystanders_of(beside, first), reference),
              "aborting_vs_quiet": parts(bystanders_of(aborted, first), reference),
              "aborting_vs_busy": parts(bystanders_of(aborted, first), bystanders_of(beside, first)),
              "dflash_only_vs_alone": parts(bystanders_of(drafting, first), vllm),
              "kvflash_only_vs_alone": unpaged(parts(bystanders_of(paging, first), vllm)),
              "kvflash": {name: out["kvflash"] for name, out in (("busy", beside), ("aborting", aborted),
                                                                   ("kvflash_only", paging))},
              "counters": {name: out["counters"] for name, out in (("busy", beside), ("aborting", aborted),
                                                                    ("dflash_only", drafting))}}
    keep_report(f"aborts_bystanders_tp{TP}", report)
    checked = ("quiet_vs_alone", "busy_vs_quiet", "aborting_vs_quiet", "dflash_only_vs_alone", "kvflash_only_vs_alone")
    assert not any(wide(report[key]) for key in checked), {key: wide(report[key]) for key in checked}
