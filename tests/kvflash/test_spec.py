"""KVFlashSpec's merge against each of vLLM's callers: whatever layer comes first, a KVFlash layer beside another kind
is "not one group", never an error that stops startup."""

import pytest
import torch

from vllm_luce.kvflash.spec import KVFlashMergeError, KVFlashSpec


def specs():
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    sliding = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16, sliding_window=64)
    return KVFlashSpec.from_full_attention(full, pool_tokens=512), full, sliding


@pytest.mark.parametrize("caught", [AssertionError, ValueError])
def test_a_mixed_merge_raises_what_every_caller_catches(caught):
    pooled, full, sliding = specs()
    for other in (full, sliding):
        with pytest.raises(caught):
            pooled.merge([pooled, other])
    with pytest.raises(KVFlashMergeError, match="different pools"):
        pooled.merge([pooled, KVFlashSpec.from_full_attention(full, pool_tokens=1024)])


def test_vllm_sees_a_pooled_first_layer_beside_sliding_ones_as_not_uniform():
    from vllm.v1.core.kv_cache_utils import is_kv_cache_spec_uniform

    pooled, _, sliding = specs()
    layers = {"model.layers.0.self_attn.attn": pooled, "model.layers.1.self_attn.attn": sliding}
    assert is_kv_cache_spec_uniform(layers) is False  # raised ValueError when merge did
    assert is_kv_cache_spec_uniform({"model.layers.0.self_attn.attn": pooled}) is True
    assert pooled.merge([pooled, pooled]) == pooled


def test_pooled_group_names_why_kvflash_cannot_pool_a_model():
    from types import SimpleNamespace

    from vllm_luce.kvflash.worker import pooled_group

    pooled, full, sliding = specs()

    def config(*group_specs):
        return SimpleNamespace(kv_cache_groups=[SimpleNamespace(kv_cache_spec=s, layer_names=[f"l{i}", f"m{i}"])
                                                for i, s in enumerate(group_specs)])

    assert pooled_group(config(sliding, pooled)) == 1
    with pytest.raises(RuntimeError, match="vllm-luce executor"):
        pooled_group(config(full, sliding))
    with pytest.raises(RuntimeError, match=r"into 2 KV cache groups of \[2, 2\] layers.*turn luce.kvflash off"):
        pooled_group(config(pooled, sliding, pooled))


def test_cold_rows_widen_the_block_table_but_not_what_a_request_must_have():
    from types import SimpleNamespace

    from vllm_luce.kvflash.spec import MAX_CHUNK

    _, full, _ = specs()
    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=65536))
    capped, cold = (KVFlashSpec.from_full_attention(full, pool_tokens=4096, cold_rows=c) for c in (False, True))
    assert capped.max_num_blocks_per_req(config, 65536) == 4096 // 16
    assert cold.max_num_blocks_per_req(config, 65536) == (65536 + MAX_CHUNK) // 16  # room for every cold chunk
    assert cold.max_memory_usage_bytes(config) == capped.max_memory_usage_bytes(config) == 256 * full.page_size_bytes
