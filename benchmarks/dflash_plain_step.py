"""CPU, through real vLLM: what a plain step of a speculating engine costs against a step of an
engine without speculation (the fixed cost the DFlash gate cannot choose away).

    python -m benchmarks.dflash_plain_step --concurrency 1 16 --repeats 5

Two engines in one process on the trained Qwen3.6 pair: ``none`` (no speculation) and ``plain``
(DFlash with vLLM-luce's gate forced to K = 0 on every step, so every step is a plain one). Passes
alternate between the engines, ``--repeats`` times; the script prints each engine's fastest and
median ms per step and their ratio (none / plain: 1.0 means plain steps cost nothing extra).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

for _k, _v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_HOST_IP": "127.0.0.1",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128, help="generated tokens per request and pass")
    args = ap.parse_args()
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = "4"

    from benchmarks import dflash_throughput as D
    from vllm_luce.spec_decode import scheduler as S

    target, drafter, method = D.pairs(Path(tempfile.mkdtemp()))["trained"]
    S.GatedLookup.__getitem__ = lambda self, batch_size: 0  # every step plain
    width = max(args.concurrency)
    engines = {"none": D.build(target, drafter, method, "none", width),
               "plain": D.build(target, drafter, method, "gated", width)}
    print("| concurrency | none ms/step (min / median) | plain ms/step (min / median) | none/plain (min / median) |")
    print("| --- | --- | --- | --- |")
    for conc in args.concurrency:
        prompts = D.prompts_for("trained", engines["none"], conc)
        for llm in engines.values():
            D.run_pass(llm, prompts, 32)  # warm-up
        ms = {mode: [] for mode in engines}
        for _ in range(args.repeats):
            for mode, llm in engines.items():
                wall, _ = D.run_pass(llm, prompts, args.tokens)
                ms[mode].append(wall / args.tokens * 1000)
        lo = {m: min(v) for m, v in ms.items()}
        med = {m: statistics.median(v) for m, v in ms.items()}
        print(f"| {conc} | {lo['none']:.2f} / {med['none']:.2f} | {lo['plain']:.2f} / {med['plain']:.2f} | "
              f"{lo['none'] / lo['plain']:.3f} / {med['none'] / med['plain']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
