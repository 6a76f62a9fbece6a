"""chunk_copy: one-launch gather/scatter of token slots across layers, against the per-layer reference,
on caches laid out as vLLM's GPU backends allocate them (NHD, HND, padded blocks).

Copies must be bit-exact, so results are compared with torch.equal; gathers land in NaN-poisoned
outputs, so a token the kernel fails to write fails the comparison.
"""

from __future__ import annotations

import pytest
import torch

from fixtures.vllm_kv import LAYOUTS, vllm_cache
from vllm_luce.kernels.chunk_copy import gather_tokens, gather_tokens_naive, scatter_tokens, scatter_tokens_naive

pytestmark = pytest.mark.kernel


def _caches(layers, blocks, heads, block, head, dtype, device, layout="NHD", seed=0):
    """Each layer's ``[blocks, heads, block, 2 * head]`` cache, every layer in its own allocation."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [vllm_cache(blocks, heads, block, head, torch.float32, "cpu", layout, g).to(dtype).to(device)
            if dtype == torch.uint8 else vllm_cache(blocks, heads, block, head, dtype, device, layout, g)
            for _ in range(layers)]


# layers, blocks, KV heads, block size, head, dtype, number of slots. 2 x 550 elements span two tiles.
CASES = [
    (1, 7, 1, 1, 1, torch.float32, 1),
    (3, 9, 3, 5, 5, torch.bfloat16, 11),
    (5, 4, 2, 16, 550, torch.float16, 9),
    (2, 5, 4, 10, 12, torch.uint8, 17),
    (4, 6, 8, 16, 128, torch.bfloat16, 64),  # one KVFlash chunk of a Qwen3-8B-shaped layer
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("layers,blocks,heads,block,head,dtype,n", CASES,
                         ids=[f"l{c[0]}-b{c[1]}x{c[3]}-h{c[2]}x{c[4]}-{str(c[5])[6:]}-n{c[6]}" for c in CASES])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_gather_then_scatter_match_the_per_layer_copies(poisoned, device, layout, layers, blocks, heads, block, head,
                                                       dtype, n, slot_dtype):
    caches = _caches(layers, blocks, heads, block, head, dtype, device, layout)
    slots = torch.randperm(blocks * block, generator=torch.Generator().manual_seed(1))[:n].to(slot_dtype).to(device)
    expected = gather_tokens_naive(caches, slots)
    poison_dtype = torch.float32 if dtype == torch.uint8 else dtype
    out = poisoned(expected.shape, poison_dtype).to(dtype) if dtype != torch.uint8 else \
        torch.full(expected.shape, 255, dtype=dtype, device=device)
    assert gather_tokens(caches, slots, out=out) is out
    assert torch.equal(out, expected)
    if dtype.is_floating_point:
        assert torch.isfinite(out).all()

    src = torch.randn(expected.shape, generator=torch.Generator().manual_seed(2)).to(dtype).to(device)
    want = [c.clone() for c in caches]
    scatter_tokens_naive(want, slots, src)
    scatter_tokens(caches, slots, src)
    for got, ref in zip(caches, want):
        assert torch.equal(got, ref)  # the tokens written, and every other slot untouched


def test_round_trip_through_host_memory_is_bit_exact(device):
    caches = _caches(3, 5, 2, 8, 8, torch.bfloat16, device)
    before = [c.clone() for c in caches]
    slots = torch.tensor([5, 39, 0, 17], device=device)
    host = gather_tokens(caches, slots).cpu()
    scatter_tokens_naive(caches, slots, torch.full(host.shape, float("nan"), dtype=host.dtype, device=device))
    scatter_tokens(caches, slots, host.to(device))
    assert all(torch.equal(a, b) for a, b in zip(caches, before))


def test_fp8_rows_move_as_bytes(device):
    caches = [c.to(torch.float8_e4m3fn) for c in _caches(2, 5, 3, 4, 4, torch.float32, device, "HND")]
    slots = torch.tensor([3, 19, 4], device=device)
    got = gather_tokens(caches, slots)
    assert got.dtype == torch.float8_e4m3fn
    assert torch.equal(got.view(torch.uint8), gather_tokens_naive(caches, slots).view(torch.uint8))


def test_no_slots_is_a_no_op(device):
    caches = _caches(2, 2, 1, 4, 2, torch.float32, device)
    assert gather_tokens(caches, torch.zeros(0, dtype=torch.int64, device=device)).shape == (2, 0, 1, 4)


@pytest.mark.parametrize("bad,match", [
    (lambda c: [c[0], c[1][:-1]], "every cache must match cache 0"),
    (lambda c: [x.transpose(2, 3) for x in c], "last dimension must be contiguous"),
    (lambda c: [x[0] for x in c], r"must be \[blocks, kv_heads, block_size, width\]"),
    (lambda c: [], "at least one layer"),
])
def test_mismatched_caches_are_refused(device, bad, match):
    caches = _caches(2, 3, 3, 4, 4, torch.float32, device)
    with pytest.raises(ValueError, match=match):
        gather_tokens(bad(caches), torch.tensor([1], device=device))


def test_bad_slots_and_sources_are_refused(device):
    caches = _caches(2, 3, 1, 4, 2, torch.float32, device)
    with pytest.raises(ValueError, match="1-D int32/int64"):
        gather_tokens(caches, torch.tensor([1.0], device=device))
    with pytest.raises(ValueError, match="src must be"):
        scatter_tokens(caches, torch.tensor([1], device=device), torch.zeros(2, 2, 1, 4, device=device))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kvflash_store_moves_chunks_the_same_in_one_launch(device, layout):
    """PagedPoolStore with the one-launch mover (what a GPU runs) equals its per-layer torch copies."""
    import numpy as np

    from vllm_luce.kernels.chunk_copy import LayerCaches
    from vllm_luce.kvflash.kv_store import PACKED_LAYOUT, PagedPoolStore

    def store(seed):
        s = PagedPoolStore(_caches(3, 13, 3, 5, 8, torch.bfloat16, device, layout, seed), PACKED_LAYOUT, 8, 5, 4)
        s.row = np.array([9, 2, 11, 0, 6, 4])  # chunks of 4 tokens across blocks of 5
        return s

    fused, plain = store(0), store(0)
    fused.mover, plain.mover = LayerCaches(fused.views), None  # a GPU store makes its mover itself
    assert torch.equal(fused.read(3), plain.read(3))
    assert torch.equal(fused.keys_at([1, 6]), plain.keys_at([1, 6]))
    page = plain.read(2)
    for s in (fused, plain):
        s.rearrange([(0, 5), (5, 0)], [(4, page)])  # swap two chunks and page one in
    assert all(torch.equal(a, b) for a, b in zip(fused.views, plain.views))
