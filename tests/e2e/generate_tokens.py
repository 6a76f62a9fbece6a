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


def build_llm(model_dir: str):
    from vllm import LLM

    return LLM(model=str(model_dir), enforce_eager=True, max_model_len=512, dtype="bfloat16", seed=0)


def greedy_run(llm) -> dict:
    """The serving class and greedy token ids of PROMPTS: what the parity tests compare."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    return {"class": llm.apply_model(lambda model: type(model).__qualname__)[0],
            "tokens": [list(o.outputs[0].token_ids) for o in outputs]}


def generate(model_dir: str) -> dict:
    llm = build_llm(model_dir)
    run = greedy_run(llm)
    del llm
    return run


if __name__ == "__main__":
    out_path, *model_dirs = sys.argv[1:]
    results = {model_dir: generate(model_dir) for model_dir in model_dirs}
    with open(out_path, "w") as f:
        json.dump(results, f)
