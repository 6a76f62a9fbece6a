"""Fidelity baselines of the trained test models through real vLLM (CPU here): the numbers
``docs/fidelity.md`` records and later features (KVFlash, PFlash, DFlash gate) must keep.

    python -m benchmarks.fidelity                 # all measurements, markdown + JSON
    python -m benchmarks.fidelity --only needle --needle-tokens 2048

Measures (greedy throughout):
  perplexity   held-out windows of 2048 tokens, from vLLM prompt logprobs
  acceptance   DFlash (upstream ``method: dflash``) mean acceptance length and per-position
               acceptance from vLLM's spec-decode metrics, on held-out code prompts
  needle       retrieval accuracy of a planted ``KEY_<n> = "<digits>"`` line at several depths
  determinism  greedy outputs of two runs identical
  parity       perplexity of the first 4 windows in HF transformers (fp32, CPU) and in vLLM:
               the trained weights are served faithfully
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

for _k, _v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "4",
               "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)

from benchmarks import report  # noqa: E402
# The measurements themselves live in fixtures.trained_llm (the end-to-end tests check the same baselines); the other
# CPU benchmarks reach them through this module (``F.build_llm``), after the environment defaults above.
from fixtures.trained_llm import (  # noqa: E402,F401
    CODE_PROMPT_TOKENS, DEPTHS, EVERY_DRAFT_VERIFIED, PPL_WINDOW, acceptance, build_llm, code_prompts, engine_runner,
    greedy, heldout_token_windows, hf_perplexity, needle_accuracy, perplexity, spec_counters)
from fixtures.trained import heldout_files, trained_model  # noqa: E402,F401

MEASURES = ["perplexity", "parity", "acceptance", "needle", "determinism"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=MEASURES, nargs="+")
    ap.add_argument("--needle-tokens", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    ap.add_argument("--needle-seeds", type=int, default=4)
    ap.add_argument("--code-prompts", type=int, default=16)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    want = set(args.only or MEASURES)
    results: dict = {}
    t0 = time.time()
    max_len = max(args.needle_tokens) + 64 if "needle" in want else 4096
    llm = build_llm(max_len)
    tok = llm.get_tokenizer()
    if "perplexity" in want:
        results["perplexity"] = {"windows": 16, "window_tokens": PPL_WINDOW,
                                 "ppl": round(perplexity(llm, heldout_token_windows(tok, 16, PPL_WINDOW)), 3)}
        print(json.dumps(results["perplexity"]), flush=True)
    if "parity" in want:
        windows = heldout_token_windows(tok, 16, PPL_WINDOW)[:4]
        results["parity"] = {"windows": 4, "vllm_ppl": round(perplexity(llm, windows), 4),
                             "hf_fp32_ppl": round(hf_perplexity(windows), 4)}
        print(json.dumps(results["parity"]), flush=True)
    if "needle" in want:
        results["needle"] = []
        for n in args.needle_tokens:
            results["needle"].append(needle_accuracy(llm, n, range(args.needle_seeds)))
            print(json.dumps(results["needle"][-1]), flush=True)
    if "determinism" in want:
        prompts = code_prompts(tok, 8)
        first, second = greedy(llm, prompts, 64), greedy(llm, prompts, 64)
        results["determinism"] = {"prompts": len(prompts), "tokens": 64, "identical": first == second}
    del llm
    if "acceptance" in want:
        spec = build_llm(4096, drafter=trained_model("qwen36-dflash"), disable_log_stats=False,
                         additional_config=EVERY_DRAFT_VERIFIED)
        results["acceptance"] = acceptance(spec, code_prompts(spec.get_tokenizer(), args.code_prompts), args.gen_tokens)
    results["wall_s"] = round(time.time() - t0, 1)
    return report(results, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
