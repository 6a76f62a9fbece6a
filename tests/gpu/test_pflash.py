"""PFlash on the GPU through vLLM's defaults, with the trained hybrid target and the trained scorer: keep 1.0
gives vLLM's tokens; keep 0.2 compresses needle prompts and the needles come back."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from fixtures import needle as N
from fixtures.trained import heldout_files, trained_model
from tests.gpu.conftest import llm_args, run_engine

KEEP = 0.2


@pytest.fixture(scope="module")
def cases():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(trained_model("tokenizer")))
    found = N.make_cases(tokenizer, list(heldout_files()), tokens=2048, depths=(0.1, 0.5, 0.9), seeds=range(2))
    return found, [tokenizer.encode(c.prompt, add_special_tokens=False) for c in found]


def spec(model, prompts, pflash=None):
    luce = {}
    if pflash is not None:
        luce = {"luce": {"pflash": {"drafter": str(trained_model("scorer")), "min_prompt_tokens": 512, **pflash}}}
    return {"model": str(model), "prompts": prompts, "max_tokens": 8,
            "llm": llm_args(max_model_len=4096, dtype="bfloat16", additional_config=luce)}


def test_keep_one_is_identical_and_compression_keeps_the_needles(trained_hybrid, cases, tmp_path):
    needles, prompts = cases
    specs = {"off": spec(trained_hybrid, prompts), "keep1": spec(trained_hybrid, prompts, {"keep_ratio": 1.0}),
             "keep": spec(trained_hybrid, prompts, {"keep_ratio": KEEP})}
    with ThreadPoolExecutor(len(specs)) as pool:  # side by side: a hybrid engine takes minutes to start
        runs = {name: pool.submit(run_engine, s, tmp_path, name=name) for name, s in specs.items()}
    off, keep1, keep = (runs[name].result() for name in specs)
    assert keep1["prompt_tokens"] == off["prompt_tokens"] and keep1["tokens"] == off["tokens"]
    found = 0
    for case, full, kept, text in zip(needles, off["prompt_tokens"], keep["prompt_tokens"], keep["texts"]):
        assert kept < 0.6 * full, (full, kept)
        found += text.startswith(case.answer)
    assert found >= len(needles) - 1, keep["texts"]
