"""Luce executors on the GPU through vLLM's defaults: greedy parity with vLLM alone (VLLM_PLUGINS empty)
for each family, on each model runner where vLLM alone runs the family. The two engines compile apart, so the
random models' tokens may part where their two best are tied within bf16's rounding (conftest.parts), and
nowhere else."""

import pytest

from tests.gpu.conftest import (RUNNERS, TP, drift_and_ties, keep_report, llm_args, parts, run_alone_or_skip,
                               run_engine, side_by_side)

PROMPTS = ["def fibonacci(n):\n    ", "import json\n\nclass Encoder", "The quick brown fox"]
# family -> the class that serves it with the plugin
FAMILIES = {"qwen3": "Qwen3ForCausalLM", "qwen3_6": "LuceQwen3_5ForConditionalGeneration",
            "gemma4": "LuceGemma4ForCausalLM", "laguna": "LuceLagunaForCausalLM"}


@pytest.fixture(scope="module")
def model_dir(tiny_model, fixtures_root):
    def get(family):
        if family == "qwen3_6":  # as vLLM 0.26 serves Qwen3.6: the multimodal class
            from fixtures.conditional import as_conditional_generation
            from fixtures.tiny_models import build_model

            # vLLM splits Gated DeltaNet key heads over TP ranks: one key head cannot run at TP=2
            # (vLLM alone asserts "qkv_dim=256 != 2*H*K + HV*V")
            base = tiny_model("qwen3_6") if TP == 1 else build_model(
                "qwen3_6", fixtures_root / f"qwen3_6-tp{TP}", linear_num_key_heads=TP, linear_num_value_heads=2 * TP)
            return as_conditional_generation(base, fixtures_root / f"qwen3_6-cg-tp{TP}")
        if family == "gemma4":  # one head dim: what vLLM 0.26 with transformers 5.17 parses (tiny_models.py)
            from fixtures.tiny_models import GEMMA4_UNIFORM, build_model

            return build_model("gemma4", fixtures_root / "gemma4-uniform", **GEMMA4_UNIFORM)
        return tiny_model(family)
    return get


@pytest.mark.parametrize("family", sorted(FAMILIES))  # a runner's families side by side, the hybrid last: a tier
@pytest.mark.parametrize("runner", sorted(RUNNERS))  # run's workers take its two slow Qwen3.6 tests apart
def test_greedy_tokens_match_vllm_alone(family, runner, model_dir, tmp_path):
    spec = {"model": str(model_dir(family)), "prompts": PROMPTS, "max_tokens": 24, "logprobs": 2,
            "llm": llm_args(max_model_len=512, dtype="bfloat16")}
    alone, luce = side_by_side((run_alone_or_skip, (spec, tmp_path, runner), {"name": "alone"}),
                               (run_engine, (spec, tmp_path), {"name": "luce", **RUNNERS[runner]}))
    assert luce["class"] == FAMILIES[family] and not alone["class"].startswith("Luce")
    assert luce["cudagraph_mode"] != "NONE" and not luce["enforce_eager"], luce
    assert luce["v2_runner"] == alone["v2_runner"] == (runner == "v2")
    assert luce["async_scheduling"] == alone["async_scheduling"]
    parted = parts(luce, alone)  # greedy parity up to a bf16 tie (TIE_GAP), as vLLM's model tests
    if parted:
        drift, _ = drift_and_ties(luce, alone)
        keep_report(f"executors_{family}_{runner}_tp{TP}", {"parts": parted, "drift": drift, "luce": luce["logprobs"],
                                                            "alone": alone["logprobs"]})
    assert all(p["tie"] for p in parted), parted
