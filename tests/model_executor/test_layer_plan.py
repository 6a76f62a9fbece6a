from types import SimpleNamespace

import pytest

from vllm_luce.model_executor.layer_plan import (
    FULL, LINEAR, SLIDING, LayerInfo, LayerPlan, layer_info_from_attention)


def attn(window=None, shared=None):
    return SimpleNamespace(num_heads=4, num_kv_heads=2, head_size=64, sliding_window=window,
                           kv_sharing_target_layer_name=shared)


def qwen_like():
    return LayerPlan(tuple(
        LayerInfo(i, LINEAR, f"model.layers.{i}.linear_attn") if (i + 1) % 4 else
        layer_info_from_attention(i, f"model.layers.{i}.self_attn.attn", attn()) for i in range(8)))


def test_summary_and_full_attention_layers():
    plan = qwen_like()
    assert plan.summary() == "8 layers: 2 full_attention, 6 linear_attention"
    assert [layer.index for layer in plan.full_attention] == [3, 7]
    assert plan.full_attention[0].head_size == 64


def test_sliding_and_kv_shared_layers_are_not_pooled():
    plan = LayerPlan((
        layer_info_from_attention(0, "l0", attn(window=512)),
        layer_info_from_attention(1, "l1", attn()),
        layer_info_from_attention(2, "l2", attn(shared="l1")),
    ))
    assert plan.layers[0].kind == SLIDING and plan.layers[0].sliding_window == 512
    assert [layer.module_name for layer in plan.full_attention] == ["l1"]
    assert plan.summary() == "3 layers: 2 full_attention, 1 sliding_attention"


def test_capture_layer_ids_are_checked_against_the_target():
    plan = qwen_like()
    plan.check_capture_layers([0, 3, 7], "drafter")
    with pytest.raises(ValueError, match=r"drafter: target layer ids \[1, 8\] include \[8\], but the "
                                         r"target has 8 decoder layers \(valid ids 0..7\)"):
        plan.check_capture_layers([1, 8], "drafter")
    with pytest.raises(ValueError, match="include \\[-1\\]"):
        plan.check_capture_layers([-1], "drafter")


def test_malformed_plans_are_refused():
    with pytest.raises(ValueError, match="one entry per decoder layer"):
        LayerPlan((LayerInfo(1, FULL, "a"), LayerInfo(1, FULL, "b")))
    with pytest.raises(ValueError, match="unknown kind"):
        LayerPlan((LayerInfo(0, "mla", "a"),))
