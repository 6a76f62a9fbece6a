"""KVFlash's key-bounds policy: the score bounds every key's logit from above, and a single key a query points
at lifts its chunk where the mean key (QK) washes it out."""

import numpy as np
import pytest
import torch

from fixtures.vllm_kv import vllm_cache
from vllm_luce.kernels.chunk_bounds.naive import outward_fp8
from vllm_luce.kvflash.kv_store import CPU_LAYOUT, PACKED_LAYOUT, PagedPoolStore
from vllm_luce.kvflash.policies import Bounds, bound_layer_scores, max_logit_layer_scores, qk_scores

L, HQ, HKV, D, T = 3, 8, 2, 16, 64


def bounds_of(keys, page=16):
    """[C, L, T, Hkv, D] keys -> [C, L, pages, Hkv, 2, D] bounds, as the policy stores them (fp8, outward)."""
    keys = keys.unflatten(2, (-1, page))
    return outward_fp8(torch.stack([keys.amin(dim=3), keys.amax(dim=3)], dim=4))


def test_fp8_bounds_still_bound_every_value_tiny_huge_and_zero():
    values = torch.tensor([0.0, 1e-30, -1e-30, 3e-6, -3e-6, 0.3, -0.3, 1.7, -1.7, 411.0, -411.0, 5e4, -5e4])
    stored = outward_fp8(torch.stack([values, values], dim=-2)).float()
    assert (stored[0] <= values).all() and (stored[1] >= values).all()
    bounds = stored.T[None, None, None, :, :, None].expand(1, 1, 1, len(values), 2, 1)  # one page per value
    scores = bound_layer_scores(torch.zeros(1, len(values), 1), bounds)  # a zero query: bound 0, or inf out of range
    assert not scores.isnan().any()


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
    pages = keys.unflatten(1, (-1, 16))
    assert torch.equal(got, torch.stack([pages.amin(dim=2), pages.amax(dim=2)], dim=3))
    assert torch.equal(Bounds.summarize(store, 1), outward_fp8(got))
