"""chunk_copy: one-launch gather/scatter of token rows across layers, against the per-layer reference.

Copies must be bit-exact, so results are compared with torch.equal; gathers land in NaN-poisoned
outputs, so a row the kernel fails to write fails the comparison.
"""

from __future__ import annotations

import pytest
import torch

from vllm_luce.kernels.chunk_copy import gather_rows, gather_rows_naive, scatter_rows, scatter_rows_naive

pytestmark = pytest.mark.kernel


def _caches(layers, rows, row_shape, dtype, device, kv_gap=0, seed=0):
    """Each layer's [2, rows, *row] cache; ``kv_gap`` extra rows between K and V (a strided view, as a
    slice of a larger allocation), and every layer in its own allocation."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(layers):
        raw = torch.randn(2, rows + kv_gap, *row_shape, generator=g).to(dtype).to(device)
        out.append(raw[:, kv_gap:])
    return out


# layers, rows, row shape, dtype, number of slots, K/V gap. A row of 2 x 1,100 elements spans two tiles.
CASES = [
    (1, 7, (1,), torch.float32, 1, 0),
    (3, 37, (3, 5), torch.bfloat16, 11, 0),
    (5, 64, (2, 1100), torch.float16, 9, 3),
    (2, 50, (4, 24), torch.uint8, 17, 1),
    (4, 96, (8, 128), torch.bfloat16, 64, 0),  # one KVFlash chunk of a Qwen3-8B-shaped layer
]


@pytest.mark.parametrize("layers,rows,row_shape,dtype,n,gap", CASES,
                         ids=[f"l{c[0]}-r{c[1]}-{'x'.join(map(str, c[2]))}-{str(c[3])[6:]}-n{c[4]}" for c in CASES])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_gather_then_scatter_match_the_per_layer_copies(poisoned, device, layers, rows, row_shape, dtype, n, gap,
                                                       slot_dtype):
    caches = _caches(layers, rows, row_shape, dtype, device, gap)
    slots = torch.randperm(rows, generator=torch.Generator().manual_seed(1))[:n].to(slot_dtype).to(device)
    expected = gather_rows_naive(caches, slots)
    poison_dtype = torch.float32 if dtype == torch.uint8 else dtype
    out = poisoned(expected.shape, poison_dtype).to(dtype) if dtype != torch.uint8 else \
        torch.full(expected.shape, 255, dtype=dtype, device=device)
    assert gather_rows(caches, slots, out=out) is out
    assert torch.equal(out, expected)
    if dtype.is_floating_point:
        assert torch.isfinite(out).all()

    src = _caches(layers, n, row_shape, dtype, device, seed=2)
    src = torch.stack([s.contiguous() for s in src])  # [layers, 2, n, *row]
    want = [c.clone() for c in caches]
    scatter_rows_naive(want, slots, src)
    scatter_rows(caches, slots, src)
    for got, ref in zip(caches, want):
        assert torch.equal(got, ref)  # the rows written, and every other row untouched


def test_round_trip_through_host_memory_is_bit_exact(device):
    caches = _caches(3, 40, (2, 16), torch.bfloat16, device)
    before = [c.clone() for c in caches]
    slots = torch.tensor([5, 39, 0, 17], device=device)
    host = gather_rows(caches, slots).cpu()
    for c in caches:
        c[:, slots] = torch.nan
    scatter_rows(caches, slots, host.to(device))
    assert all(torch.equal(a, b) for a, b in zip(caches, before))


def test_fp8_rows_move_as_bytes(device):
    caches = [c.to(torch.float8_e4m3fn) for c in _caches(2, 20, (3, 8), torch.float32, device)]
    slots = torch.tensor([3, 19, 4], device=device)
    got = gather_rows(caches, slots)
    assert got.dtype == torch.float8_e4m3fn
    assert torch.equal(got.view(torch.uint8), gather_rows_naive(caches, slots).view(torch.uint8))


def test_no_slots_is_a_no_op(device):
    caches = _caches(2, 8, (4,), torch.float32, device)
    assert gather_rows(caches, torch.zeros(0, dtype=torch.int64, device=device)).shape == (2, 2, 0, 4)


@pytest.mark.parametrize("bad,match", [
    (lambda c: [c[0], c[1][:, :-1]], "every cache must match cache 0"),
    (lambda c: [x.transpose(2, 3) for x in c], "must be contiguous"),
    (lambda c: [x[0] for x in c], r"must be \[2, rows"),
    (lambda c: [], "at least one layer"),
])
def test_mismatched_caches_are_refused(device, bad, match):
    caches = _caches(2, 10, (3, 4), torch.float32, device)
    with pytest.raises(ValueError, match=match):
        gather_rows(bad(caches), torch.tensor([1], device=device))


def test_bad_slots_and_sources_are_refused(device):
    caches = _caches(2, 10, (4,), torch.float32, device)
    with pytest.raises(ValueError, match="1-D int32/int64"):
        gather_rows(caches, torch.tensor([1.0], device=device))
    with pytest.raises(ValueError, match="src must be"):
        scatter_rows(caches, torch.tensor([1], device=device), torch.zeros(2, 2, 2, 4, device=device))


def test_kvflash_store_moves_chunks_the_same_in_one_launch(device):
    """PagedPoolStore with the one-launch mover (what a GPU runs) equals its per-layer torch copies."""
    import numpy as np

    from vllm_luce.kernels.chunk_copy import LayerRows
    from vllm_luce.kvflash.kv_store import NHD_LAYOUT, PagedPoolStore

    def store(seed):
        g = torch.Generator().manual_seed(seed)
        caches = [torch.randn(2, 13, 5, 3, 8, generator=g).to(torch.bfloat16).to(device) for _ in range(3)]
        s = PagedPoolStore(caches, NHD_LAYOUT, 8, 5, 4)  # chunks of 4 tokens across blocks of 5
        s.row = np.array([9, 2, 11, 0, 6, 4])
        return s

    fused, plain = store(0), store(0)
    fused.mover, plain.mover = LayerRows(fused.rows), None  # a GPU store makes its mover itself
    assert torch.equal(fused.read(3), plain.read(3))
    assert torch.equal(fused.keys_at([1, 6]), plain.keys_at([1, 6]))
    page = plain.read(2)
    for s in (fused, plain):
        s.rearrange([(0, 5), (5, 0)], [(4, page)])  # swap two chunks and page one in
    assert all(torch.equal(a, b) for a, b in zip(fused.views, plain.views))
