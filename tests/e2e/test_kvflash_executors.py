"""KVFlash on the Gemma 4 and Laguna executors: only the full-attention layers are pooled (sliding-window
layers stay exact, as upstream), tokens match KVFlash off when the pool covers the context, and a
prompt beyond the pool completes, wherever the full-attention layers sit: first (the layout whose first
KV cache spec is KVFlash's, which vLLM's uniformity check merges first), middle and last."""

import json

import pytest

from tests.e2e.dflash_probe import engine
from vllm_luce.kernels.scored_dims import ScoredDims
from tests.e2e.test_kvflash import greedy, kvflash, make_llm, prompt


# The salient summary's dims from each model's RoPE: Gemma 4's proportional RoPE rotates the first 16 pairs of each
# 64-dim half of its 128-dim global heads; Laguna's full-attention layers rotate the first half of each 64-dim head.
SCORED = {"gemma4": ScoredDims(16, 64), "laguna": ScoredDims(32)}
F, S = "full_attention", "sliding_attention"
# The reported layout (one full-attention layer, first), and one with a full-attention layer first, in the middle and
# last (as many full as sliding layers: vLLM keeps them one group; with more full than sliding it splits them).
LAYOUTS = {"first": [F, S, S, S], "first_middle_last": [F, S, F, S, S, F]}


def one_at_a_time(llm, prompts):
    """Greedy tokens of each prompt alone: batched, KVFlash's step cap (320 tokens with this pool) splits the second
    prompt's prefill where vLLM alone does not, and the random tiny models' top two logits are often within bf16
    rounding of each other (0.008 nats apart at the first token that then differed)."""
    return [greedy(llm, [p])[0] for p in prompts]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("family", ["gemma4", "laguna"])
def test_other_executors_pool_only_full_attention_and_match_off(fixtures_root, family, layout):
    from fixtures.tiny_models import build_layout

    path = build_layout(family, fixtures_root, LAYOUTS[layout])
    kinds = json.loads((path / "config.json").read_text())["layer_types"]  # Gemma 4's config makes its last layer full
    assert kinds[0] == F and kinds[:-1] == LAYOUTS[layout][:-1]
    prompts = [prompt(200, 11), prompt(300, 12)]
    llm = make_llm(path)
    reference = one_at_a_time(llm, prompts)
    del llm
    llm = make_llm(path, kvflash(pool=512))
    groups = engine(llm).model_executor.driver_worker.worker.model_runner.kv_cache_config.kv_cache_groups
    pooled = sorted(name for g in groups if type(g.kv_cache_spec).__name__ == "KVFlashSpec" for name in g.layer_names)
    assert pooled == [f"model.layers.{i}.self_attn.attn" for i, kind in enumerate(kinds) if kind == F]
    runtime = engine(llm).model_executor.driver_worker.worker.model_runner.luce_kvflash
    assert runtime.policy.scored == SCORED[family]
    assert one_at_a_time(llm, prompts) == reference
    assert len(greedy(llm, [prompt(4 * 512, 13)], gen=4)[0]) == 4  # several times the pool: completes
    del llm
