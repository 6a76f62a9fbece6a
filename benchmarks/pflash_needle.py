"""PFlash fidelity with the trained fixture models through real vLLM (CPU): needle retention (is the
planted line still in the prompt the target prefilled?) and answer accuracy, against the uncompressed
prompt, at several keep ratios, with and without the lexical anchors.

    python -m benchmarks.pflash_needle --tokens 4096 8192 --keeps 0.05 0.1 0.2 --seeds 4 --json out.json
    python -m benchmarks.pflash_needle --keeps 0.05 --early-exit 1 2 --no-baseline   # the scorer's first layers only
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

from benchmarks import fidelity as F, report
from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model


def run(label: str, pflash: dict | None, tokens: list[int], seeds: int, max_len: int) -> list[dict]:
    from vllm import SamplingParams

    cfg = {"luce": {"pflash": {"drafter": str(trained_model("scorer")), "min_prompt_tokens": 1024, **pflash}}} \
        if pflash else None
    llm = F.build_llm(max_len, **({"additional_config": cfg} if cfg else {}))
    tok = llm.get_tokenizer()
    rows = []
    for n in tokens:
        t0 = time.time()
        cases = N.make_cases(tok, list(heldout_files()), tokens=n, depths=F.DEPTHS, seeds=range(seeds))
        outs = llm.generate([c.prompt for c in cases], SamplingParams(max_tokens=N.NEEDLE_DIGITS + 2, temperature=0),
                            use_tqdm=False)
        kept = [tok.decode(o.prompt_token_ids) for o in outs]
        retained = [f'= "{c.answer}"' in k for c, k in zip(cases, kept)]
        hits = [N.retrieved(c, o.outputs[0].text) for c, o in zip(cases, outs)]
        row = {"config": label, "tokens": n, "cases": len(cases),
               "prefilled_share": round(sum(len(o.prompt_token_ids) for o in outs) / sum(c.prompt_tokens for c in cases), 3),
               "retained": round(sum(retained) / len(cases), 3), "accuracy": round(sum(hits) / len(cases), 3),
               "seconds": round(time.time() - t0, 1)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    del llm
    gc.collect()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192])
    ap.add_argument("--keeps", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--early-exit", type=int, nargs="+", default=[0], metavar="LAYERS",
                    help="pflash.early_exit_layers values to run (0: every layer); anchors on only when not 0")
    ap.add_argument("--no-baseline", action="store_true", help="skip the uncompressed run")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    max_len = max(args.tokens) + 64
    rows = [] if args.no_baseline else run("uncompressed", None, args.tokens, args.seeds, max_len)
    for layers in args.early_exit:
        for keep in args.keeps:
            for anchors in ((True, False) if not layers else (True,)):
                label = f"keep {keep}, anchors {'on' if anchors else 'off'}" + (f", early exit {layers}" if layers else "")
                cfg = {"keep_ratio": keep, "anchors": anchors, **({"early_exit_layers": layers} if layers else {})}
                rows += run(label, cfg, args.tokens, args.seeds, max_len)
    return report(rows, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
