"""KVFlash decode cost vs context through real vLLM on CPU (trained fixture target), in one run:
decode ms/token at each context with KVFlash off and with a pool, and the ratio to the shortest.

Decode time = (time for 1 + N generated tokens - time for 1 token) / N, same prompt, so the
prefill cancels out. Goal (issue 5): with KVFlash, longest/shortest stays at most 1.15.

    python -m benchmarks.kvflash_cpu_decode --contexts 2048 32000 --pool 1024 --decode 64
    python -m benchmarks.kvflash_cpu_decode --selections page sfi --decode 800   # SFI too, dense refreshes included
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

from benchmarks import fidelity as F, report


def timed(llm, prompt: list[int], max_tokens: int) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return time.perf_counter() - t0


def decode_ms_per_token(llm, prompt: list[int], decode: int, repeats: int) -> float:
    timed(llm, prompt[:256], 4)  # warm-up
    best = []
    for _ in range(repeats):
        first = timed(llm, prompt, 1)
        full = timed(llm, prompt, 1 + decode)
        best.append((full - first) / decode * 1e3)
    return min(best)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[2048, 32000])
    ap.add_argument("--pool", type=int, default=1024)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--selections", nargs="+", default=["page"], choices=["page", "sfi"])
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rng = random.Random(0)
    prompts = {n: [rng.randrange(10, 4000) for _ in range(n)] for n in args.contexts}
    max_len = max(args.contexts) + args.decode + 8
    results = {}
    configs = [("off", {})] + [(f"pool {args.pool}" if s == "page" else f"SFI, budget {args.pool}",
                                {"luce": {"kvflash": {"pool_tokens": args.pool, "selection": s}}})
                               for s in args.selections]
    for label, cfg in configs:
        llm = F.build_llm(max_len, additional_config=cfg)
        row = {n: round(decode_ms_per_token(llm, prompts[n], args.decode, args.repeats), 3) for n in args.contexts}
        shortest = row[min(args.contexts)]
        results[label] = {"decode_ms_per_token": row,
                          "ratio_to_shortest": {n: round(v / shortest, 3) for n, v in row.items()}}
        rt = getattr(F.engine_runner(llm), "luce_kvflash", None)
        if rt is not None:
            results[label]["kvflash"] = rt.stats()
        print(json.dumps({label: results[label]}), flush=True)
        del llm
    return report(results, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
