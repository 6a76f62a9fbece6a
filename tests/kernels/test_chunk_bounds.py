"""chunk_bounds: KVFlash's key-bounds summaries and scores against their PyTorch references. Summaries must
equal the torch path bit for bit (fp8 bytes), in vLLM's GPU cache layouts and in caches that keep K apart,
on odd sizes, with infinities, beyond-range and subnormal keys, and every e5m2 rounding boundary; scores
must match within fp32 summation order, on GQA groups, pages 1 to 4 and strided inputs. Outputs start
NaN-poisoned, so anything a kernel leaves unwritten fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.vllm_kv import LAYOUTS, vllm_cache
from vllm_luce.kernels.chunk_bounds import bound_scores, bound_scores_naive, key_bounds, key_bounds_naive
from vllm_luce.kernels.chunk_bounds.naive import outward_fp8
from vllm_luce.kernels.chunk_copy import LayerCaches
from vllm_luce.kvflash.policies import Bounds

pytestmark = pytest.mark.kernel

# "split": a [2, blocks, block, kv_heads, head] cache (K and V apart), passed as its K view
CACHE_LAYOUTS = LAYOUTS + ("split",)


def _caches(layers, blocks, heads, block, d, dtype, device, layout, seed=0):
    """(the caches as the kernel and the reference take them, [blocks, kv_heads, block, width] each)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "split":
        raw = [torch.randn(2, blocks, block, heads, d, generator=g).to(dtype).to(device) for _ in range(layers)]
        return [c[0].transpose(1, 2) for c in raw]
    return [vllm_cache(blocks, heads, block, d, dtype, device, layout, g) for _ in range(layers)]


def _fp8_poisoned(shape, device):
    return torch.full(shape, float("nan")).to(torch.float8_e5m2).to(device)


def _same_bytes(got, ref):
    """Equal fp8 bytes; NaN where the reference is NaN (its sign is the platform's)."""
    nan = ref.float().isnan()
    assert torch.equal(got.float().isnan(), nan)
    assert torch.equal(got.view(torch.uint8)[~nan], ref.view(torch.uint8)[~nan])


# layers, blocks x block size, KV heads, head size, dtype, slots, page tokens
BOUND_CASES = [
    (1, 5, 16, 1, 64, torch.bfloat16, 16, 16),   # one page, one KV head
    (3, 7, 16, 3, 128, torch.float16, 64, 16),   # a 64-token chunk: four pages of 16
    (2, 9, 5, 2, 72, torch.float32, 36, 12),     # odd block size, head size and page size
    (1, 3, 4, 1, 1, torch.float32, 4, 1),        # one-token pages, head size 1
]


@pytest.mark.parametrize("layout", CACHE_LAYOUTS)
@pytest.mark.parametrize("layers,blocks,block,heads,d,dtype,n,page", BOUND_CASES,
                         ids=[f"l{c[0]}-b{c[1]}x{c[2]}-h{c[3]}-d{c[4]}-{str(c[5])[6:]}-n{c[6]}p{c[7]}"
                              for c in BOUND_CASES])
def test_key_bounds_equal_the_reference_bit_for_bit(device, layout, layers, blocks, block, heads, d, dtype, n, page):
    caches = _caches(layers, blocks, heads, block, d, dtype, device, layout, seed=n)
    slots = torch.randperm(blocks * block, generator=torch.Generator().manual_seed(d))[:n].to(device)
    out = _fp8_poisoned((layers, n // page, heads, 2, d), device)
    assert key_bounds(LayerCaches(caches), slots, d, page, out=out) is out
    ref = key_bounds_naive(caches, slots, d, page)
    assert not ref.float().isnan().any()
    assert torch.equal(out.view(torch.uint8), ref.view(torch.uint8))
    lo, hi = out.float().unbind(3)
    assert (lo < hi).all()  # outward: even a one-token page's bounds straddle its key


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, on the inf and NaN fed on purpose
def test_key_bounds_round_every_value_class_as_torch_does(device):
    """One-token pages of an fp32 cache, so each bound is one chosen value: every e5m2 midpoint and code with
    the outward shift taken off (ties to even both ways), their fp32 neighbours, random bit patterns of every
    exponent, infinities, NaN, zeros, and values past e5m2's range (which torch rounds to infinity)."""
    codes = torch.arange(256, dtype=torch.int16).to(torch.uint8).view(torch.float8_e5m2).float()
    codes = codes[codes.isfinite()].unique()
    points = torch.cat([codes, (codes[1:] + codes[:-1]) / 2])
    values = [torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 57344.0, 61440.0, 65536.0,
                            1e5, -1e5, 1e-45, -1e-45, 2.0 ** -16, 3 * 2.0 ** -17, 1e-30])]
    for shifted in ((points + 2 ** -15) / 0.75, (points + 2 ** -15) / 1.25, (points - 2 ** -15) / 0.75,
                    (points - 2 ** -15) / 1.25):
        for x in (shifted, -shifted):
            up, down = torch.tensor(float("inf")), torch.tensor(float("-inf"))
            values += [x, torch.nextafter(x, up), torch.nextafter(x, down)]
    bits = torch.randint(-2 ** 31, 2 ** 31 - 1, (4096,), generator=torch.Generator().manual_seed(0))
    values.append(bits.to(torch.int32).view(torch.float32))
    v = torch.cat(values)
    d = 512
    v = torch.cat([v, torch.zeros(-len(v) % d)]).view(-1, 1, 1, d)  # [blocks, 1 head, 1-token block, K]
    cache = torch.cat([v, torch.full_like(v, float("nan"))], dim=-1).to(device)  # V: never read
    slots = torch.arange(len(v), device=device)
    got = key_bounds(LayerCaches([cache]), slots, d, 1)
    _same_bytes(got, key_bounds_naive([cache], slots, d, 1))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, on the inf and NaN fed on purpose
def test_key_bounds_of_a_page_with_infinite_and_nan_keys(device):
    caches = _caches(2, 4, 3, 8, 16, torch.bfloat16, device, "NHD", seed=5)
    caches[0][1, 0, 2, 3] = float("inf")
    caches[0][1, 2, 5, 7] = float("-inf")
    caches[1][2, 1, 0, 0] = 3e5  # beyond e5m2's range: +inf max, and +inf min for a page of only such keys
    caches[1][0, 1, 7, 9] = float("nan")
    slots = torch.tensor([8, 13, 9, 10, 16, 0, 7, 1], device=device)  # blocks 1, 2 and 0
    got = key_bounds(LayerCaches(caches), slots, 16, 4)
    ref = key_bounds_naive(caches, slots, 16, 4)
    _same_bytes(got, ref)
    assert got.float().isinf().sum() >= 3 and got.float().isnan().any()


def test_key_bounds_refuse_fp8_caches_and_partial_pages(device):
    caches = _caches(1, 2, 2, 4, 8, torch.float32, device, "HND")
    fp8 = [c.to(torch.float8_e4m3fn) for c in caches]
    with pytest.raises(TypeError, match="fp8 caches take the torch path"):
        key_bounds(LayerCaches(fp8), torch.arange(4, device=device), 8, 4)
    with pytest.raises(ValueError, match="do not split into pages of 4"):
        key_bounds(LayerCaches(caches), torch.arange(6, device=device), 8, 4)
    with pytest.raises(ValueError, match="out must be"):
        key_bounds(LayerCaches(caches), torch.arange(4, device=device), 8, 4, out=torch.empty(1, 1, 2, 2, 8))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kvflash_store_bounds_through_the_kernel_equal_the_torch_path(device, layout):
    """PagedPoolStore.outward_key_bounds with the one-launch mover (what a GPU runs) equals its per-layer torch
    path, and is what Bounds summarises, for 32-token chunks straddling blocks of 5."""
    from vllm_luce.kvflash.kv_store import PACKED_LAYOUT, PagedPoolStore

    def store():
        s = PagedPoolStore(_caches(3, 17, 2, 5, 40, torch.bfloat16, device, layout, 4), PACKED_LAYOUT, 40, 5, 32)
        s.row = np.random.default_rng(0).permutation(17)[:13]
        return s

    fused, plain = store(), store()
    fused.mover, plain.mover = LayerCaches(fused.views), None  # a GPU store makes its mover itself
    for position in (0, 1):
        got = Bounds.summarize(fused, position)
        assert got.shape == (3, 2, 2, 2, 40) and got.dtype == torch.float8_e5m2
        assert torch.equal(got.view(torch.uint8), Bounds.summarize(plain, position).view(torch.uint8))
        assert torch.equal(got.view(torch.uint8), outward_fp8(plain.key_bounds(position, 16)).view(torch.uint8))


def _bounds(chunks, layers, pages, hkv, d, seed, device):
    """Random [C, L, pages, Hkv, 2, D] fp8 bounds as the policy stores them (min <= max, outward)."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(2, chunks, layers, pages, hkv, d, generator=g)
    return outward_fp8(torch.stack([torch.minimum(a, b), torch.maximum(a, b) + 0.5], dim=-2)).to(device)


# chunks, layers, query heads, KV heads, pages, head size, query dtype
SCORE_CASES = [
    (1, 1, 1, 1, 1, 1, torch.float32),
    (37, 3, 12, 3, 4, 64, torch.float32),   # groups of 4 over 3 KV heads; 37 chunks span two blocks
    (5, 2, 8, 8, 1, 128, torch.bfloat16),   # no grouping, one page
    (9, 2, 4, 1, 4, 128, torch.float16),    # one KV head, groups of 4
    (3, 1, 6, 2, 2, 80, torch.bfloat16),
]


@pytest.mark.parametrize("chunks,layers,hq,hkv,pages,d,dtype", SCORE_CASES,
                         ids=[f"c{c[0]}-l{c[1]}-{c[2]}q{c[3]}kv-p{c[4]}-d{c[5]}-{str(c[6])[6:]}" for c in SCORE_CASES])
def test_bound_scores_match_the_reference(poisoned, device, chunks, layers, hq, hkv, pages, d, dtype):
    g = torch.Generator().manual_seed(chunks * 7 + d)
    queries = torch.randn(layers, hq, d, generator=g).to(dtype).to(device)
    bounds = _bounds(chunks, layers, pages, hkv, d, chunks + d, device)
    out = poisoned((chunks, layers))
    assert bound_scores(queries, bounds, out=out) is out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, bound_scores_naive(queries, bounds), atol=1e-5, rtol=1e-5)


def test_bound_scores_read_strided_bounds_and_pick_the_group_and_page(device):
    """Bounds as a strided view (a slice of a larger table, KV heads and pages transposed); one page whose
    bounds a query head of its own group points at sets that chunk's score for that layer."""
    layers, hq, hkv, pages, d, chunks = 2, 8, 4, 3, 32, 11
    table = _bounds(chunks + 4, layers, hkv, pages, d, 1, device).transpose(2, 3)  # stored [.., Hkv, pages, ..]
    bounds = table[4:]  # [chunks, layers, pages, hkv, 2, d], not contiguous
    queries = torch.randn(layers, 2 * hq, d, generator=torch.Generator().manual_seed(2)).to(device)[:, ::2]
    spike = torch.where(queries[1, 5] > 0, 60.0, -60.0)  # head 5 belongs to KV head 2
    bounds[6, 1, 2, 5 // 2] = torch.stack([spike.clamp(max=0), spike.clamp(min=0)]).to(torch.float8_e5m2)
    out = bound_scores(queries, bounds)
    torch.testing.assert_close(out, bound_scores_naive(queries, bounds), atol=1e-5, rtol=1e-5)
    assert out[:, 1].argmax().item() == 6


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, on the inf and NaN fed on purpose
def test_infinite_bounds_and_nan_queries_score_plus_infinity_as_the_torch_path(device):
    queries = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(3)).to(device)
    queries[0, :, 3] = 0.0  # a zero element against an infinite bound: NaN, read as unbounded
    bounds = _bounds(5, 2, 2, 2, 16, 4, device)
    bounds[1, 0, 1, 0, 1, 3] = float("inf")
    bounds[3, 0, 0, 1, 0, 5] = float("-inf")
    queries[1, 1, 7] = float("nan")
    got, ref = bound_scores(queries, bounds), bound_scores_naive(queries, bounds)
    assert got[1, 0] == ref[1, 0] == float("inf") and got[3, 0] == ref[3, 0] == float("inf")
    assert (got[:, 1] == float("inf")).all()  # a NaN query element bounds nothing
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert bound_scores(queries, bounds[:0]).shape == (0, 2)


@pytest.mark.parametrize("bad,match", [
    (lambda q, b: (q[0], b), r"queries must be \[layers"),
    (lambda q, b: (q, b[:, :1]), "do not match queries"),
    (lambda q, b: (q[:, :3], b), "3 query heads do not group over 2"),
    (lambda q, b: (q, b[:, :, :0]), "at least one page"),
    (lambda q, b: (q, b.float()), "bounds float8_e5m2"),
    (lambda q, b: (q.to(torch.int32), b), "float32, float16 or bfloat16"),
])
def test_bound_scores_refuse_bad_shapes(device, bad, match):
    q, b = torch.randn(2, 4, 8, device=device), _bounds(5, 2, 2, 2, 8, 0, device)
    with pytest.raises((ValueError, TypeError), match=match):
        bound_scores(*bad(q, b))
