"""Offline `vllm.LLM` with DFlash, KVFlash and PFlash on one engine.

    python examples/offline_llm.py [--target DIR] [--drafter DIR|FILE.gguf] [--scorer DIR]

- DFlash: vLLM's own `speculative_config` with `"method": "dflash"` and the drafter's path.
- KVFlash and PFlash: `additional_config={"luce": {"kvflash": {...}, "pflash": {...}}}`.

The defaults are the small models trained for the tests (`tests/assets/trained`): a 6.7 M-parameter
Qwen3.6-architecture target that writes Python, its DFlash drafter, and a 1.3 M-parameter PFlash
scorer. Three prompts:
  needle   ~2K tokens of held-out code with `KEY_<n> = "<digits>"` planted in the middle, ending
           with `KEY_<n> = "`: PFlash prefills only the chunks that matter and the answer survives;
  code     ~2K tokens of code, opted out of PFlash: KVFlash keeps only its pool resident;
  snippet  a few lines of Python to complete.
DFlash speculates on all three. It prints the generations and what each feature did.
"""

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

# One process: the engine starts faster, and llm.get_metrics() sees the engine's and the worker's
# counters at once (from a separate engine process they arrive up to a second late). The rest are
# settings for vLLM's CPU backend, harmless on a GPU.
for key, value in {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
                   "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1"}.items():
    os.environ.setdefault(key, value)

TRAINED = Path(__file__).resolve().parents[1] / "tests" / "assets" / "trained"
# Prompts end inside a line: this tokenizer merges a newline with the next indent, so a prompt that
# ends with "\n" reads as the end of a file to the model.
SNIPPET = "import os\n\n\ndef read_lines(path):\n    with open(path) as f:\n        return"


def code_texts(path: Path) -> list[str]:
    """Source texts: a `.jsonl.gz` of {"text": ...} rows (the held-out corpus) or one text file."""
    if path.name.endswith(".jsonl.gz"):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            return [json.loads(line)["text"] for line in f]
    return [path.read_text()]


def code_lines(texts: list[str], tokenizer, tokens: int, skip: int = 0) -> list[str]:
    """Whole lines of code, about `tokens` tokens, starting `skip` texts in (no `KEY_` lines)."""
    hay, chars = [], 0
    for text in texts[skip:] + texts[:skip]:
        for line in text.splitlines(keepends=True):
            if "KEY_" not in line and chars < 5 * tokens:  # code runs about 3 characters per token
                hay.append(line)
                chars += len(line)
    text = tokenizer.decode(tokenizer.encode("".join(hay), add_special_tokens=False)[:tokens])
    return text[: text.rfind("\n") + 1].splitlines(keepends=True)


def needle_prompt(texts: list[str], tokenizer, tokens: int) -> tuple[str, str]:
    """Code with `KEY_48213 = "<digits>"` in the middle, ending with `KEY_48213 = "`; and the digits."""
    hay, digits = code_lines(texts, tokenizer, tokens - 32), "260181"
    mid = len(hay) // 2
    return "".join(hay[:mid]) + f'KEY_48213 = "{digits}"\n' + "".join(hay[mid:]) + 'KEY_48213 = "', digits


def total(metrics, name: str, **labels) -> float:
    """Sum of the metric `name` over the series whose labels include `labels`."""
    return sum(m.value for m in metrics if m.name == name and labels.items() <= m.labels.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=TRAINED / "qwen36-target")
    ap.add_argument("--drafter", type=Path, default=TRAINED / "qwen36-dflash", help="DFlash drafter (dir or .gguf)")
    ap.add_argument("--scorer", type=Path, default=TRAINED / "scorer", help="PFlash drafter (HF causal LM dir)")
    ap.add_argument("--haystack", type=Path, default=TRAINED / "heldout.jsonl.gz", help="code for the long prompts")
    ap.add_argument("--long-tokens", type=int, default=2048, help="length of the long prompts")
    ap.add_argument("--pool-tokens", type=int, default=1024, help="KVFlash pool per request")
    args = ap.parse_args()

    from vllm import LLM, SamplingParams

    start = time.time()
    llm = LLM(
        model=str(args.target), dtype="bfloat16", max_model_len=4096, seed=0, enforce_eager=True,
        # Hybrid (Gated DeltaNet) targets with DFlash need prefix caching off on vLLM's CPU backend.
        enable_prefix_caching=False,
        disable_log_stats=False,  # keeps vLLM's speculative-decoding counters for llm.get_metrics()
        speculative_config={"method": "dflash", "model": str(args.drafter), "num_speculative_tokens": 7},
        additional_config={"luce": {
            "kvflash": {"pool_tokens": args.pool_tokens},
            # min_prompt_tokens 512: these prompts are 2K tokens (the default, 4096, suits real models).
            "pflash": {"drafter": str(args.scorer), "keep_ratio": 0.2, "min_prompt_tokens": 512},
        }},
    )
    print(f"engine ready in {time.time() - start:.1f}s: target {args.target.name}, DFlash drafter "
          f"{args.drafter.name}, KVFlash pool {args.pool_tokens} tokens, PFlash scorer {args.scorer.name}")

    tokenizer = llm.get_tokenizer()
    texts = code_texts(args.haystack)
    needle, answer = needle_prompt(texts, tokenizer, args.long_tokens)
    code = "".join(code_lines(texts, tokenizer, args.long_tokens, skip=len(texts) // 2)).rstrip("\n")
    prompts = {"needle": needle, "code": code, "snippet": SNIPPET}
    params = {
        "needle": SamplingParams(max_tokens=8, temperature=0),
        # A per-request opt-out of PFlash (the server form: extra_body={"vllm_xargs": {"luce_pflash": "off"}}).
        "code": SamplingParams(max_tokens=32, temperature=0, extra_args={"luce_pflash": "off"}),
        "snippet": SamplingParams(max_tokens=48, temperature=0),
    }
    outs = dict(zip(prompts, llm.generate(list(prompts.values()), list(params.values()), use_tqdm=False)))

    print(f"\nneedle: expected {answer}, generated {outs['needle'].outputs[0].text!r}")
    print(f"needle answered: {outs['needle'].outputs[0].text.startswith(answer)}")
    print(f"code: ...{code.splitlines()[-1]!r} -> {outs['code'].outputs[0].text!r}")
    print(f"snippet:\n{SNIPPET}{outs['snippet'].outputs[0].text}\n")

    # PFlash: the engine receives the kept tokens, so RequestOutput.prompt_token_ids is what was prefilled.
    for name, out in outs.items():
        sent = len(tokenizer.encode(prompts[name], add_special_tokens=False))
        print(f"PFlash: {name} prompt {sent} -> {len(out.prompt_token_ids)} tokens prefilled")
    # What each feature did, from vLLM's metrics and vllm-luce's `vllm:luce_*` ones (docs/metrics.md).
    metrics = llm.get_metrics()
    outcomes = {m.labels["outcome"]: m.value for m in metrics if m.name == "vllm:luce_pflash_prompts"}
    print(f"PFlash outcomes: {outcomes}")
    drafts, accepted = total(metrics, "vllm:spec_decode_num_drafts"), total(metrics, "vllm:spec_decode_num_accepted_tokens")
    print(f"DFlash: gate ran {total(metrics, 'vllm:luce_dflash_gate_steps', mode='spec'):.0f} speculative and "
          f"{total(metrics, 'vllm:luce_dflash_gate_steps', mode='plain'):.0f} plain steps; {drafts:.0f} drafts "
          f"verified, mean acceptance length {1 + accepted / max(drafts, 1):.2f}")
    print(f"KVFlash: pool {args.pool_tokens} tokens per request; "
          f"{total(metrics, 'vllm:luce_kvflash_page_outs'):.0f} chunks paged out "
          f"({total(metrics, 'vllm:luce_kvflash_page_out_bytes') / 2**20:.1f} MiB to host), "
          f"{total(metrics, 'vllm:luce_kvflash_page_ins'):.0f} paged back in, "
          f"{total(metrics, 'vllm:luce_kvflash_reselections'):.0f} reselections")
    print(f"done in {time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
