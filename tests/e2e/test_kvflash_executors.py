"""KVFlash on the Gemma 4 and Laguna executors: only the full-attention layers are pooled (sliding-window
layers stay exact, as upstream), tokens match KVFlash off when the pool covers the context, and a
prompt beyond the pool completes."""

import pytest

from tests.e2e.dflash_probe import engine
from vllm_luce.kernels.scored_dims import ScoredDims
from tests.e2e.test_kvflash import greedy, kvflash, make_llm, prompt


# The salient summary's dims from each model's RoPE: Gemma 4's proportional RoPE rotates the first 16 pairs of each
# 64-dim half of its 128-dim global heads; Laguna's full-attention layers rotate the first half of each 64-dim head.
SCORED = {"gemma4": ScoredDims(16, 64), "laguna": ScoredDims(32)}


@pytest.mark.parametrize("family", ["gemma4", "laguna"])
def test_other_executors_pool_only_full_attention_and_match_off(tiny_model, family):
    path = tiny_model(family)
    prompts = [prompt(200, 11), prompt(300, 12)]
    llm = make_llm(path)
    reference = greedy(llm, prompts)
    del llm
    llm = make_llm(path, kvflash(pool=512))
    groups = engine(llm).model_executor.driver_worker.worker.model_runner.kv_cache_config.kv_cache_groups
    pooled_layers = [g.layer_names for g in groups if type(g.kv_cache_spec).__name__ == "KVFlashSpec"]
    assert pooled_layers == [["model.layers.3.self_attn.attn"]]  # the one full-attention layer
    runtime = engine(llm).model_executor.driver_worker.worker.model_runner.luce_kvflash
    assert runtime.policy.scored == SCORED[family]
    assert greedy(llm, prompts) == reference
    assert len(greedy(llm, [prompt(4 * 512, 13)], gen=4)[0]) == 4  # beyond the pool: completes
    del llm
