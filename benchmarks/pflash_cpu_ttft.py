"""CPU, through real vLLM: time to first token with PFlash on and off (trained target and scorer).

    python -m benchmarks.pflash_cpu_ttft --tokens 8192 16384 30000 --keep 0.05 --json out.json

Each prompt is a needle case over held-out code; time to first token is the wall time of
``LLM.generate`` with max_tokens=1 (PFlash on: scoring on the worker + selection + the compressed
prefill), best of ``--reps``. The engine with PFlash off runs first, then the one with PFlash on
(one engine at a time); both see the same prompts after one warm-up prompt.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from benchmarks import fidelity as F, report
from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model


def measure(llm, prompts: list[list[int]], reps: int) -> list[dict]:
    from vllm import SamplingParams

    one = SamplingParams(max_tokens=1, temperature=0)
    llm.generate([{"prompt_token_ids": prompts[0][:2048]}], one, use_tqdm=False)  # warm-up
    rows = []
    for ids in prompts:
        best, prefilled = float("inf"), None
        for _ in range(reps):
            t0 = time.perf_counter()
            out = llm.generate([{"prompt_token_ids": ids}], one, use_tqdm=False)[0]
            best = min(best, time.perf_counter() - t0)
            prefilled = len(out.prompt_token_ids)
        rows.append({"prompt_tokens": len(ids), "prefilled_tokens": prefilled, "ttft_s": round(best, 3)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[8192, 16384, 30000])
    ap.add_argument("--keep", type=float, default=0.05)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    files = list(heldout_files())
    prompts = [tok.encode(N.make_case(tok, files, tokens=n, depth=0.5, seed=0).prompt, add_special_tokens=False)
               for n in args.tokens]
    max_len = max(len(p) for p in prompts) + 16
    llm = F.build_llm(max_len)
    off = measure(llm, prompts, args.reps)
    del llm
    pflash = {"drafter": str(trained_model("scorer")), "keep_ratio": args.keep, "min_prompt_tokens": 4096}
    llm = F.build_llm(max_len, additional_config={"luce": {"pflash": pflash}})
    on = measure(llm, prompts, args.reps)
    del llm
    rows = [{"prompt_tokens": a["prompt_tokens"], "keep": args.keep, "ttft_off_s": a["ttft_s"],
             "ttft_pflash_s": b["ttft_s"], "prefilled_tokens": b["prefilled_tokens"],
             "speedup": round(a["ttft_s"] / b["ttft_s"], 2)} for a, b in zip(off, on)]
    return report(rows, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
