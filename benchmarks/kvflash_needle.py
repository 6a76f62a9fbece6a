"""KVFlash needle retrieval with the trained fixture target through real vLLM (CPU): full KV vs
pooled KV with each policy, at a fixed pool (so residency = pool / prompt length).

    python -m benchmarks.kvflash_needle --tokens 2048 4096 --pool 512 --seeds 4 --json out.json
    python -m benchmarks.kvflash_needle --policies scorer   # PFlash's drafter as the KVFlash scorer
    python -m benchmarks.kvflash_needle --policies qk --selections sfi   # SFI: all KV resident, sparse decode
    python -m benchmarks.kvflash_needle --distractors 2   # multi-needle: 3 KEY lines, the prompt asks for one
    python -m benchmarks.kvflash_needle --reask   # asked, evicted, asked again (fixtures/reask.py)
    python -m benchmarks.kvflash_needle --policies salient bounds --query-windows 1 8   # query window sizes
    python -m benchmarks.kvflash_needle --selected   # was the needle's chunk chosen, and was it then answered

Each row also gives the pagers' totals (``kvflash``): with a prompt longer than the pool, a needle outside the
sinks and the recent chunks was paged out during prefill, so a hit there is a chunk the pool brought back
(``page_ins``) at the reselection before the prompt's last token.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks import fidelity as F, report
from fixtures import reask as R
from fixtures.trained import trained_model


def run(label: str, additional_config: dict, tokens: list[int], seeds: int, max_len: int,
        distractors: int = 0, reask_pool: int = 0, selected: bool = False) -> list[dict]:
    """``reask_pool``: the "evicted earlier, asked again" conversations, scripted for a pool of that many tokens."""
    if reask_pool:
        from fixtures.forced import ForcedTokens

        llm = F.build_llm(max_len, additional_config=additional_config, logits_processors=[ForcedTokens])
    else:
        llm = F.build_llm(max_len, additional_config=additional_config)
    rows = []
    for n in tokens:
        t0 = time.time()
        before = _totals(llm)
        if reask_pool:
            cases = R.make_cases(llm.get_tokenizer(), n, range(seeds), reask_pool)
            result = {"tokens": n, **R.reask_accuracy(llm, cases)}
        elif selected and before is not None:
            result = {"tokens": n, **R.needle_selection(llm, n, range(seeds), distractors)}
        else:
            result = F.needle_accuracy(llm, n, range(seeds), distractors=distractors)
        result.update(config=label, seconds=round(time.time() - t0, 1))
        after = _totals(llm)
        if after is not None:  # this length's own pager totals
            result["kvflash"] = {k: round(v - before[k], 4) for k, v in after.items()}
        print(json.dumps(result), flush=True)
        rows.append(result)
    del llm
    return rows


def _totals(llm) -> dict | None:
    rt = getattr(F.engine_runner(llm), "luce_kvflash", None)
    return None if rt is None else rt.stats()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--pool", type=int, default=512)
    ap.add_argument("--policies", nargs="+", default=["lru", "qk"])
    ap.add_argument("--selections", nargs="+", default=["page"], choices=["page", "sfi"])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--distractors", type=int, default=0, help="other needles per prompt (multi-needle)")
    ap.add_argument("--reask", action="store_true", help="asked, evicted by later reselections, asked again")
    ap.add_argument("--selected", action="store_true",
                    help="pooled rows count prompts whose needle chunk the prompt-end reselection chose")
    ap.add_argument("--query-windows", type=int, nargs="+", default=[None],
                    help="luce.kvflash.query_window values to run (default: the setting's default)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    max_len = max(args.tokens) + (2048 if args.reask else 64)
    reask = args.pool if args.reask else 0
    rows = run("full KV", {}, args.tokens, args.seeds, max_len, args.distractors, reask)
    for selection in args.selections:
        for policy in args.policies:
            for window in args.query_windows:
                cfg = {"luce": {"kvflash": {"pool_tokens": args.pool, "policy": policy, "selection": selection}}}
                if window is not None:
                    cfg["luce"]["kvflash"]["query_window"] = window
                if policy == "scorer":  # PFlash's drafter scores the chunks; prompts are not compressed
                    cfg["luce"]["pflash"] = {"drafter": str(trained_model("scorer")), "min_prompt_tokens": 1 << 30}
                label = f"pool {args.pool}, {policy}" + (", SFI" if selection == "sfi" else "") + \
                    (f", window {window}" if window is not None else "")
                rows += run(label, cfg, args.tokens, args.seeds, max_len, args.distractors, reask, args.selected)
    return report(rows, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
