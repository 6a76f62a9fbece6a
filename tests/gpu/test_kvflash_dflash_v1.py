"""Model Runner V1's pieces beside KVFlash's paging and DFlash's drafts, one switched off at a time (issue 67).

`test_kvflash_dflash.py` found requests that never page parting from vLLM alone at clear top-1s on V1 only (V2,
KVFlash alone and a pool that pages nothing agree), with the block-ownership audit clean. Each engine here runs the
gated DFlash + KVFlash engine of that test with `tests/gpu/v1_probe.py`: the scheduler's steps, the recurrent-state
realigner's moves, a check of every DFlash drafter slot against its request's blocks, and a checksum of the pooled
K and V of every computed token of each request that never paged, compared each step; variants switch off the
realigner, the plain-step patch, or the pagers' views of the live block table. The report holds each wide part's
step-by-step timeline beside the same request's in the engine that pages nothing. Fails on a drafter slot outside its
request's blocks, a changed K/V of a computed token, or a never-paged request's step written elsewhere than at its
positions or read at another length, in any engine, or a wide part where every piece is on."""

from tests.gpu.conftest import RUNNERS, keep_report, llm_args, parts, run_engine, side_by_side
from tests.gpu.test_dflash import IN_PROCESS, WIDE_NATS, tp1_only
from tests.gpu.test_kvflash_dflash import SHARED, churn_specs, kvflash

VARIANTS = {"both": (1024, []), "both-no-paging": (8192, []), "both-realigner-off": (1024, ["realigner"]),
            "both-plain-off": (1024, ["plain"]), "both-row-copy": (1024, ["rowview"])}


def timeline(probe: dict, request: int, until: int) -> list[dict]:
    """The request's steps up to its ``until``-th kept token: tokens and drafts scheduled, tokens kept, whether the
    realigner moved it, whether it is back after a step away, and the batch: rows, tokens, rows with drafts, decode
    rows without drafts and prefill rows."""
    ids = {r for step in probe["steps"] for r in step["n"] if r.split("-")[0] == str(request)}
    moved = {step for step, reqs in probe["moves"] if ids & set(reqs)}
    rows, kept, present = [], 0, False
    for k, step in enumerate(probe["steps"]):
        mine = ids & set(step["n"])
        if not mine:
            present = False
            continue
        req = mine.pop()
        drafted = step["spec"]
        rows.append({"step": k, "n": step["n"][req], "drafts": drafted.get(req, 0),
                     "kept": step.get("out", {}).get(req), "at": kept, "moved": k in moved, "back": not present,
                     "rows": len(step["n"]),
                     "tokens": sum(step["n"].values()), "drafting": len(drafted),
                     "plain_decodes": sum(1 for r, n in step["n"].items() if n == 1 and r not in drafted),
                     "prefills": sum(1 for r, n in step["n"].items() if n > 1 and r not in drafted)})
        kept += step.get("out", {}).get(req) or 0
        present = True
        if kept > until:
            break
    return rows


@tp1_only
def test_v1_pieces_beside_paging_and_drafts(trained_hybrid, tmp_path):
    base, gated = churn_specs(trained_hybrid)
    calls = [(run_engine, ({**base, "llm": llm_args(**SHARED)}, tmp_path),
              {"name": "vllm-alone", "plugins": False, **RUNNERS["v1"]})]
    for name, (pool, off) in VARIANTS.items():
        spec = {**gated, "v1_probe": {"off": off}, "llm": llm_args(
            additional_config=kvflash(pool_tokens=pool), **SHARED, speculative_config={"model": "dflash"})}
        calls.append((run_engine, (spec, tmp_path), {"name": name, **IN_PROCESS, **RUNNERS["v1"]}))
    alone, *outs = side_by_side(*calls)
    report = {}
    for name, out in zip(VARIANTS, outs):
        found = parts(out, alone)
        probe = out["v1_probe"]
        report[name] = {"wide": [p for p in found if p["gaps"][1] > WIDE_NATS], "parts": found,
                        "stray_drafter_slots": probe["stray"], "checked_passes": probe["checks"],
                        "kv_changed": probe["kv_changed"], "kv_tracked": probe["kv_tracked"],
                        "misplaced": probe["misplaced"],
                        "groups": probe["groups"], "kvflash": out["kvflash"], "probe": probe}
    reference = report["both-no-paging"]["probe"]
    for name in VARIANTS:
        probe = report[name]["probe"]
        report[name]["timelines"] = {p["request"]: {"here": timeline(probe, p["request"], p["position"]),
                                                    "no_paging": timeline(reference, p["request"], p["position"])}
                                     for p in report[name]["wide"]}
    keep_report("kvflash_dflash_v1_pieces_tp1", report)
    assert all(report[name]["checked_passes"] > 0 for name in VARIANTS), report
    assert not any(report[name]["stray_drafter_slots"] for name in VARIANTS), \
        {name: report[name]["stray_drafter_slots"][:8] for name in VARIANTS}
    assert all(report[name]["kv_tracked"] > 0 for name in VARIANTS), report
    assert not any(report[name]["kv_changed"] or report[name]["misplaced"] for name in VARIANTS), \
        {name: (report[name]["kv_changed"][:8], report[name]["misplaced"][:8]) for name in VARIANTS}
    assert not report["both"]["wide"], report["both"]["wide"]
