"""KVFlash's key-bounds policy: the score bounds every key's logit from above, and a single key a query points
at lifts its chunk where the mean key (QK) washes it out."""

import numpy as np
import pytest
import torch

from tests.fixtures.vllm_kv import vllm_cache
from vllm_luce.kvflash.kv_store import CPU_LAYOUT, PACKED_LAYOUT, PagedPoolStore
from vllm_luce.kvflash.policies import Bounds, QK, bound_layer_scores, max_logit_layer_scores, qk_scores

L, HQ, HKV, D, T = 3, 8, 2, 16, 64


def bounds_of(keys, page=16):
    """[C, L, T, Hkv, D] keys -> [C, L, pages, Hkv, 2, D] bounds (what PagedPoolStore.key_bounds stores)."""
    keys = keys.unflatten(2, (-1, page))
    return torch.stack([keys.amin(dim=3), keys.amax(dim=3)], dim=4)


def test_the_bound_is_never_below_any_keys_logit():
    g = torch.Generator().manual_seed(0)
    queries, keys = torch.randn(L, HQ, D, generator=g), torch.randn(40, L, T, HKV, D, generator=g)
    bound, exact = bound_layer_scores(queries, bounds_of(keys)), max_logit_layer_scores(queries, keys)
    assert bound.shape == exact.shape == (40, L)
    assert (bound >= exact - 1e-5).all()


def test_one_key_the_query_points_at_lifts_its_chunk_above_the_rest():
    g = torch.Generator().manual_seed(1)
    queries = torch.randn(L, HQ, D, generator=g)
    keys = 0.3 * torch.randn(30, L, T, HKV, D, generator=g) + torch.randn(L, 1, HKV, D, generator=g)  # keys cluster
    needle = 17
    keys[needle, :, 5] = 4 * queries.view(L, HKV, HQ // HKV, D)[:, :, 0] / queries.norm(dim=-1).view(
        L, HKV, -1)[:, :, :1]  # one token's keys align with a query head of each group
    pager = type("P", (), {"queries": queries, "summaries": dict(enumerate(bounds_of(keys)))})()
    assert int(Bounds().scores(pager, list(range(30))).argmax()) == needle
    assert int(qk_scores(queries, keys.mean(dim=2)).argmax()) != needle  # the mean key does not find it


@pytest.mark.parametrize("layout", [CPU_LAYOUT, PACKED_LAYOUT], ids=["cpu", "packed"])
def test_the_store_bounds_are_the_chunks_key_extremes_in_the_cache_dtype(layout):
    g = torch.Generator().manual_seed(2)
    if layout is CPU_LAYOUT:
        caches = [torch.randn(8, HKV, 16, 2 * D, generator=g).to(torch.bfloat16) for _ in range(L)]
    else:
        caches = [vllm_cache(8, HKV, 16, D, generator=g) for _ in range(L)]
    store = PagedPoolStore(caches, layout, D, 16, 32)
    store.row = np.array([5, 1, 7, 2])
    keys = store.keys_at([1])[0]  # [L, T, Hkv, D]
    got = store.key_bounds(1, 16)
    assert got.dtype == torch.bfloat16 and got.shape == (L, 2, HKV, 2, D)
    assert torch.equal(got, bounds_of(keys[None])[0])
