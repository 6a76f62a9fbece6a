"""Greedy token ids for each model directory, written as JSON: `python generate_tokens.py OUT DIR...`.

Run as a subprocess by the parity tests, so that `VLLM_LUCE_EXECUTORS=off` (vLLM's own model
classes) and the default (Luce executors) each get a fresh process and plugin registration.
"""

import json
import os
import sys

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

PROMPTS = ["def fibonacci(n):\n    ", "import json\n\nclass Encoder", "The quick brown fox"]
MAX_TOKENS = 24


def generate(model_dir: str) -> dict:
    from vllm import LLM, SamplingParams

    llm = LLM(model=model_dir, enforce_eager=True, max_model_len=512, dtype="bfloat16", seed=0)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    model_class = llm.apply_model(lambda model: type(model).__name__)[0]
    del llm
    return {"class": model_class, "tokens": [list(o.outputs[0].token_ids) for o in outputs]}


if __name__ == "__main__":
    out_path, *model_dirs = sys.argv[1:]
    results = {model_dir: generate(model_dir) for model_dir in model_dirs}
    with open(out_path, "w") as f:
        json.dump(results, f)
