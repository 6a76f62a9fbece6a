"""chunk_score: KVFlash's QK summaries and scores against their PyTorch references, on odd sizes,
GQA groups, head sizes 64 to 512 and strided inputs; outputs start NaN-poisoned, so anything the
kernel leaves unwritten (or computes non-finite) fails."""

from __future__ import annotations

import pytest
import torch

from fixtures.vllm_kv import LAYOUTS, vllm_cache
from vllm_luce.kernels.chunk_copy import LayerCaches
from vllm_luce.kernels.chunk_score import chunk_scores, chunk_scores_naive, key_means, key_means_naive

pytestmark = pytest.mark.kernel

# chunks, layers, query heads, KV heads, head size, dtype
SCORE_CASES = [
    (1, 1, 1, 1, 1, torch.float32),
    (37, 3, 12, 4, 64, torch.float32),
    (70, 2, 6, 6, 80, torch.bfloat16),   # no grouping; 70 chunks span three blocks
    (5, 4, 32, 8, 128, torch.float16),   # Qwen3-8B's heads
    (9, 2, 8, 2, 256, torch.bfloat16),
    (3, 1, 4, 1, 512, torch.float32),
]


@pytest.mark.parametrize("chunks,layers,hq,hkv,d,dtype", SCORE_CASES,
                         ids=[f"c{c[0]}-l{c[1]}-{c[2]}q{c[3]}kv-d{c[4]}-{str(c[5])[6:]}" for c in SCORE_CASES])
def test_chunk_scores_match_the_reference(poisoned, device, chunks, layers, hq, hkv, d, dtype):
    g = torch.Generator().manual_seed(chunks * 7 + d)
    queries = torch.randn(layers, hq, d, generator=g).to(dtype).to(device)
    summaries = torch.randn(chunks, layers, hkv, d, generator=g).to(dtype).to(device)
    out = poisoned((chunks, layers))
    assert chunk_scores(queries, summaries, out=out) is out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, chunk_scores_naive(queries, summaries), atol=2e-6, rtol=1e-5)


def test_chunk_scores_read_strided_inputs_and_pick_the_group_of_each_head(device):
    """Summaries as a strided view (a slice of a larger table, KV heads and layers transposed); a query
    head equal to its own group's summary scores 1 for that chunk and layer only."""
    layers, hq, hkv, d, chunks = 3, 8, 4, 48, 11
    g = torch.Generator().manual_seed(3)
    table = torch.randn(chunks + 5, hkv, layers, d, generator=g).to(device)
    summaries = table[5:].transpose(1, 2)  # [chunks, layers, hkv, d], not contiguous
    queries = torch.randn(layers, hq * 2, d, generator=g).to(device)[:, ::2]  # strided heads
    queries[1, 5] = summaries[7, 1, 5 // 2] * 3.0  # head 5 belongs to KV head 2
    out = chunk_scores(queries, summaries)
    torch.testing.assert_close(out, chunk_scores_naive(queries, summaries), atol=2e-6, rtol=1e-5)
    assert out[7, 1].item() == pytest.approx(1.0, abs=1e-5)
    assert out[:, 1].argmax().item() == 7


def test_zero_summaries_score_zero_as_torch_normalize_does(device):
    queries = torch.randn(2, 4, 16, device=device)
    summaries = torch.zeros(3, 2, 2, 16, device=device)
    assert torch.equal(chunk_scores(queries, summaries), torch.zeros(3, 2, device=device))
    assert chunk_scores(queries, summaries[:0]).shape == (0, 2)


@pytest.mark.parametrize("bad,match", [
    (lambda q, s: (q[0], s), r"queries must be \[layers"),
    (lambda q, s: (q, s[:, :1]), "do not match queries"),
    (lambda q, s: (q[:, :3], s), "3 query heads do not group over 2"),
    (lambda q, s: (q.to(torch.int32), s), "float32, float16 or bfloat16"),
])
def test_chunk_scores_refuse_bad_shapes(device, bad, match):
    q, s = torch.randn(2, 4, 8, device=device), torch.randn(5, 2, 2, 8, device=device)
    with pytest.raises((ValueError, TypeError), match=match):
        chunk_scores(*bad(q, s))


def _caches(layers, blocks, heads, block, d, dtype, device, layout="NHD", seed=0):
    g = torch.Generator().manual_seed(seed)
    return [vllm_cache(blocks, heads, block, d, dtype, device, layout, g) for _ in range(layers)]


# layers, blocks x block size, KV heads, head size, dtype, number of slots
MEAN_CASES = [
    (1, 5, 1, 1, 1, torch.float32, 1),
    (3, 7, 16, 3, 72, torch.bfloat16, 64),   # one 64-token chunk, two token tiles
    (2, 3, 16, 8, 128, torch.float16, 33),
    (2, 7, 3, 2, 512, torch.float32, 7),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("layers,blocks,block,heads,d,dtype,n", MEAN_CASES,
                         ids=[f"l{c[0]}-b{c[1]}x{c[2]}-h{c[3]}-d{c[4]}-{str(c[5])[6:]}-n{c[6]}" for c in MEAN_CASES])
def test_key_means_match_the_reference(poisoned, device, layout, layers, blocks, block, heads, d, dtype, n):
    caches = _caches(layers, blocks, heads, block, d, dtype, device, layout)
    slots = torch.randperm(blocks * block, generator=torch.Generator().manual_seed(n))[:n].to(device)
    out = poisoned((layers, heads, d))
    assert key_means(LayerCaches(caches), slots, d, out=out) is out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, key_means_naive(caches, slots, d), atol=1e-5, rtol=1e-5)


def test_key_means_read_keys_not_values(device):
    caches = _caches(2, 3, 2, 4, 8, torch.float32, device)
    for c in caches:
        c[..., 8:] = float("nan")  # values: never read
    slots = torch.tensor([4, 1, 9], device=device)
    got = key_means(LayerCaches(caches), slots, 8)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, key_means_naive(caches, slots, 8))


def test_key_means_refuse_fp8_caches_and_empty_slots(device):
    caches = [c.to(torch.float8_e4m3fn) for c in _caches(1, 2, 2, 3, 8, torch.float32, device)]
    with pytest.raises(TypeError, match="fp8 caches take the torch path"):
        key_means(LayerCaches(caches), torch.tensor([1], device=device), 8)
    with pytest.raises(ValueError, match="non-empty"):
        key_means(LayerCaches(_caches(1, 2, 2, 3, 8, torch.float32, device)), torch.zeros(0, dtype=torch.int64), 8)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kvflash_store_summaries_through_the_kernel_match_the_torch_path(device, layout):
    """PagedPoolStore.summarize with the one-launch mover (what a GPU runs) equals its per-layer torch path,
    for a chunk that straddles cache blocks."""
    import numpy as np

    from vllm_luce.kvflash.kv_store import PACKED_LAYOUT, PagedPoolStore

    def store():
        s = PagedPoolStore(_caches(3, 13, 3, 5, 40, torch.bfloat16, device, layout, 4), PACKED_LAYOUT, 40, 5, 4)
        s.row = np.array([9, 2, 11, 0, 6, 4])  # chunks of 4 tokens across blocks of 5
        return s

    fused, plain = store(), store()
    fused.mover, plain.mover = LayerCaches(fused.views), None  # a GPU store makes its mover itself
    for position in (0, 1, 5):
        torch.testing.assert_close(fused.summarize(position), plain.summarize(position), atol=1e-6, rtol=1e-5)
