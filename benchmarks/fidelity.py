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
import math
import os
import time
from pathlib import Path

for _k, _v in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "4",
               "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}.items():
    os.environ.setdefault(_k, _v)

from benchmarks import report  # noqa: E402
from fixtures import needle as N  # noqa: E402
from fixtures.trained import heldout_files, trained_model  # noqa: E402

PPL_WINDOW = 2048
CODE_PROMPT_TOKENS = 256
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
MEASURES = ["perplexity", "parity", "acceptance", "needle", "determinism"]
# Acceptance is the drafter's quality: measured with every draft verified (vllm-luce's gate off).
EVERY_DRAFT_VERIFIED = {"luce": {"dflash": {"gate": False}}}


def build_llm(max_model_len: int, *, drafter: Path | None = None, num_spec: int = 15, **kw):
    from vllm import LLM

    spec = None
    if drafter is not None:
        spec = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": num_spec}
    return LLM(model=str(trained_model("qwen36-target")), dtype="bfloat16", enforce_eager=True, seed=0,
               max_model_len=max_model_len, speculative_config=spec,
               # Hybrid GDN + DFlash with prefix caching needs a Triton kernel vLLM's CPU backend lacks.
               enable_prefix_caching=False, **kw)


def engine_runner(llm):
    """The in-process V1 model runner (VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner


def heldout_token_windows(tokenizer, count: int, length: int) -> list[list[int]]:
    ids: list[int] = []
    for f in heldout_files():
        ids += tokenizer.encode(f["text"], add_special_tokens=False) + [tokenizer.pad_token_id]
    stride = len(ids) // count
    return [ids[i * stride : i * stride + length] for i in range(count)]


def code_prompts(tokenizer, count: int) -> list[list[int]]:
    """The first CODE_PROMPT_TOKENS tokens of the first ``count`` held-out files long enough."""
    prompts = []
    for f in heldout_files():
        ids = tokenizer.encode(f["text"], add_special_tokens=False)
        if len(ids) >= 2 * CODE_PROMPT_TOKENS:
            prompts.append(ids[:CODE_PROMPT_TOKENS])
        if len(prompts) == count:
            break
    return prompts


def perplexity(llm, windows: list[list[int]]) -> float:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    outs = llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False)
    nll, n = 0.0, 0
    for w, o in zip(windows, outs):
        for tok, lp in zip(w[1:], o.prompt_logprobs[1:]):
            nll -= lp[tok].logprob
            n += 1
    return math.exp(nll / n)


def hf_perplexity(windows: list[list[int]]) -> float:
    """The same windows through HF transformers in fp32 (its PyTorch Gated DeltaNet)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(trained_model("qwen36-target"), dtype=torch.float32).eval()
    nll, n = 0.0, 0
    with torch.no_grad():
        for w in windows:
            x = torch.tensor([w])
            logits = model(input_ids=x).logits[0, :-1].float()
            nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
            n += len(w) - 1
    return math.exp(nll / n)


def greedy(llm, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def spec_counters(llm) -> tuple[int, int, list[int]]:
    """Cumulative DFlash counters from vLLM's metrics: drafts, accepted tokens, accepted per position."""
    vals = {m.name: m for m in llm.get_metrics()}
    per_pos = vals.get("vllm:spec_decode_num_accepted_tokens_per_pos")
    return (int(vals["vllm:spec_decode_num_drafts"].value), int(vals["vllm:spec_decode_num_accepted_tokens"].value),
            list(per_pos.values) if per_pos else [])


def acceptance(llm, prompts: list[list[int]], max_tokens: int) -> dict:
    """Mean acceptance length (1 + accepted per draft) and per-position acceptance rates for one run."""
    d0, a0, p0 = spec_counters(llm)
    greedy(llm, prompts, max_tokens)
    d1, a1, p1 = spec_counters(llm)
    drafts = d1 - d0
    per_pos = [b - a for a, b in zip(p0 or [0] * len(p1), p1)]
    return {"prompts": len(prompts), "max_tokens": max_tokens, "drafts": drafts,
            "mean_acceptance_length": round(1 + (a1 - a0) / drafts, 3),
            "per_position_rate": [round(p / drafts, 3) for p in per_pos]}


def needle_accuracy(llm, tokens: int, seeds: range, depths=DEPTHS, distractors: int = 0) -> dict:
    """``distractors``: other needles planted at random depths (multi-needle prompts asking for one)."""
    from vllm import SamplingParams

    tokenizer = llm.get_tokenizer()
    cases = N.make_cases(tokenizer, list(heldout_files()), tokens=tokens, depths=depths, seeds=seeds,
                         distractors=distractors)
    params = SamplingParams(max_tokens=N.NEEDLE_DIGITS + 2, temperature=0.0)
    outs = llm.generate([c.prompt for c in cases], params, use_tqdm=False)
    hits = [N.retrieved(c, o.outputs[0].text) for c, o in zip(cases, outs)]
    by_depth = {d: sum(h for c, h in zip(cases, hits) if c.depth == d) / len(seeds) for d in depths}
    return {"tokens": tokens, "cases": len(cases), "distractors": distractors, "accuracy": round(sum(hits) / len(hits), 3),
            "by_depth": {str(d): round(a, 3) for d, a in by_depth.items()},
            "mean_prompt_tokens": round(sum(c.prompt_tokens for c in cases) / len(cases))}


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
