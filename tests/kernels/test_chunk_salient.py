"""chunk_salient: KVFlash's salient-key summaries and scores against their PyTorch references. Summaries must
equal the torch path's fp8 bytes in vLLM's GPU cache layouts and in caches that keep K apart, on odd sizes,
chunks longer than a token block, and with infinite and NaN keys; scores must match within fp32 summation order,
on GQA groups, query windows and strided inputs. Outputs start NaN-poisoned, so anything a kernel leaves
unwritten fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.vllm_kv import LAYOUTS, vllm_cache
from vllm_luce.kernels.chunk_copy import LayerCaches
from vllm_luce.kernels.chunk_copy.naive import gather_tokens_naive
from vllm_luce.kernels.chunk_salient import salient_keys, salient_keys_naive, salient_scores, salient_scores_naive
from vllm_luce.kvflash.policies import Salient

pytestmark = pytest.mark.kernel

CACHE_LAYOUTS = LAYOUTS + ("split",)  # "split": a [2, blocks, block, kv_heads, head] cache, passed as its K view


def _caches(layers, blocks, heads, block, d, dtype, device, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout == "split":
        raw = [torch.randn(2, blocks, block, heads, d, generator=g).to(dtype).to(device) for _ in range(layers)]
        return [c[0].transpose(1, 2) for c in raw]
    return [vllm_cache(blocks, heads, block, d, dtype, device, layout, g) for _ in range(layers)]


def _fp8_poisoned(shape, device):
    return torch.full(shape, float("nan")).to(torch.float8_e5m2).to(device)


def _same_bytes(got, ref):
    nan = ref.float().isnan()
    assert torch.equal(got.float().isnan(), nan)
    assert torch.equal(got.view(torch.uint8)[~nan], ref.view(torch.uint8)[~nan])


# layers, blocks x block size, KV heads, head size, dtype, slots
KEY_CASES = [
    (1, 5, 16, 1, 64, torch.bfloat16, 16),
    (3, 7, 16, 3, 128, torch.float16, 64),    # a 64-token chunk over blocks of 16
    (2, 9, 5, 2, 72, torch.float32, 37),      # odd block size, head size and token count
    (1, 3, 4, 1, 1, torch.float32, 5),        # head size 1
    (2, 50, 16, 2, 64, torch.bfloat16, 600),  # 600 tokens: several token blocks, the farthest in a late one
]


@pytest.mark.parametrize("layout", CACHE_LAYOUTS)
@pytest.mark.parametrize("layers,blocks,block,heads,d,dtype,n", KEY_CASES,
                         ids=[f"l{c[0]}-b{c[1]}x{c[2]}-h{c[3]}-d{c[4]}-{str(c[5])[6:]}-n{c[6]}" for c in KEY_CASES])
def test_salient_keys_equal_the_reference_bytes(device, layout, layers, blocks, block, heads, d, dtype, n):
    caches = _caches(layers, blocks, heads, block, d, dtype, device, layout, seed=n)
    slots = torch.randperm(blocks * block, generator=torch.Generator().manual_seed(d))[:n].to(device)
    if n == 600:  # make the farthest key of layer 1, head 0 one of the last block's tokens
        _set_key(caches[1], slots[-3], 0, torch.full((d,), 12.0, device=device))
    out = _fp8_poisoned((layers, heads, d), device)
    assert salient_keys(LayerCaches(caches), slots, d, out=out) is out
    ref = salient_keys_naive(caches, slots, d)
    assert not ref.float().isnan().any()
    _same_bytes(out, ref)
    keys = gather_tokens_naive(caches, slots)[..., :d]  # [L, T, H, D]: the summary is one of the chunk's keys
    for layer in range(layers):
        for head in range(heads):
            rounded = keys[layer, :, head].float().to(torch.float8_e5m2).view(torch.uint8)
            assert (rounded == out[layer, head].view(torch.uint8)).all(dim=-1).any()
    if n == 600:
        assert torch.equal(out[1, 0].float(), torch.full((d,), 12.0, device=device))


def _set_key(cache, slot, head, value):
    """Write ``value`` as the key of ``head`` at cache ``slot`` (through the cache's strides)."""
    block, offset = divmod(int(slot), cache.shape[2])
    cache[block, head, offset, : len(value)] = value.to(cache.dtype)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, on the inf and NaN fed on purpose
def test_salient_keys_with_infinite_and_nan_keys_pick_as_the_torch_path(device):
    """A NaN or infinite key makes the mean, hence every distance, NaN (read as +inf) or infinite: the first token
    wins the tie, as torch's argmax gives it."""
    caches = _caches(2, 4, 3, 8, 16, torch.bfloat16, device, "NHD", seed=5)
    slots = torch.tensor([8, 13, 9, 10, 16, 0, 7, 1], device=device)  # blocks 1, 2 and 0
    _set_key(caches[0], 10, 2, torch.full((16,), float("nan")))
    _set_key(caches[1], 16, 1, torch.full((16,), float("inf")))
    got = salient_keys(LayerCaches(caches), slots, 16)
    ref = salient_keys_naive(caches, slots, 16)
    _same_bytes(got, ref)
    first = gather_tokens_naive(caches, slots[:1])[:, 0, :, :16].float().to(torch.float8_e5m2)  # [L, H, D]
    assert torch.equal(got[0, 2].view(torch.uint8), first[0, 2].view(torch.uint8))
    assert torch.equal(got[1, 1].view(torch.uint8), first[1, 1].view(torch.uint8))


def test_salient_keys_refuse_fp8_caches_and_bad_outputs(device):
    caches = _caches(1, 2, 2, 4, 8, torch.float32, device, "HND")
    with pytest.raises(TypeError, match="fp8 caches take the torch path"):
        salient_keys(LayerCaches([c.to(torch.float8_e4m3fn) for c in caches]), torch.arange(4, device=device), 8)
    with pytest.raises(ValueError, match="out must be"):
        salient_keys(LayerCaches(caches), torch.arange(4, device=device), 8, out=torch.empty(1, 2, 8))
    with pytest.raises(ValueError, match="non-empty"):
        salient_keys(LayerCaches(caches), torch.arange(0, device=device), 8)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kvflash_store_salient_keys_through_the_kernel_equal_the_torch_path(device, layout):
    """PagedPoolStore.salient_keys with the one-launch mover (what a GPU runs) equals its torch path, and is what
    Salient summarises, for 32-token chunks straddling blocks of 5."""
    from vllm_luce.kvflash.kv_store import PACKED_LAYOUT, PagedPoolStore

    def store():
        s = PagedPoolStore(_caches(3, 17, 2, 5, 40, torch.bfloat16, device, layout, 4), PACKED_LAYOUT, 40, 5, 32)
        s.row = np.random.default_rng(0).permutation(17)[:13]
        return s

    fused, plain = store(), store()
    fused.mover, plain.mover = LayerCaches(fused.views), None  # a GPU store makes its mover itself
    for position in (0, 1):
        got = Salient.summarize(fused, position)
        assert got.shape == (3, 2, 40) and got.dtype == torch.float8_e5m2
        _same_bytes(got, Salient.summarize(plain, position))


def _keys(chunks, layers, hkv, d, seed, device):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(chunks, layers, hkv, d, generator=g).to(torch.float8_e5m2).to(device)


# chunks, layers, query rows, KV heads, head size, query dtype
SCORE_CASES = [
    (1, 1, 1, 1, 1, torch.float32),
    (37, 3, 12, 3, 64, torch.float32),     # groups of 4 over 3 KV heads; 37 chunks span two blocks
    (5, 2, 8, 8, 128, torch.bfloat16),     # no grouping
    (9, 2, 32, 1, 128, torch.float16),     # one KV head, 4 heads x a window of 8 tokens
    (3, 1, 6, 2, 80, torch.bfloat16),
]


@pytest.mark.parametrize("chunks,layers,hq,hkv,d,dtype", SCORE_CASES,
                         ids=[f"c{c[0]}-l{c[1]}-{c[2]}q{c[3]}kv-d{c[4]}-{str(c[5])[6:]}" for c in SCORE_CASES])
def test_salient_scores_match_the_reference(poisoned, device, chunks, layers, hq, hkv, d, dtype):
    queries = torch.randn(layers, hq, d, generator=torch.Generator().manual_seed(chunks * 7 + d)).to(dtype).to(device)
    keys = _keys(chunks, layers, hkv, d, chunks + d, device)
    out = poisoned((chunks, layers))
    assert salient_scores(queries, keys, out=out) is out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, salient_scores_naive(queries, keys), atol=1e-5, rtol=1e-5)


def test_salient_scores_read_strided_keys_and_pick_the_group(device):
    """Keys as a strided view (a slice of a larger table, layers and KV heads transposed); one key that a query
    row of its own group points at sets that chunk's score for that layer."""
    layers, hq, hkv, d, chunks = 2, 8, 4, 32, 11
    table = _keys(chunks + 4, hkv, layers, d, 1, device).transpose(1, 2)  # stored [.., Hkv, layers, ..]
    keys = table[4:]  # [chunks, layers, hkv, d], not contiguous
    queries = torch.randn(layers, 2 * hq, d, generator=torch.Generator().manual_seed(2)).to(device)[:, ::2]
    keys[6, 1, 5 // 2] = (queries[1, 5] * 8).to(torch.float8_e5m2)  # row 5 belongs to KV head 2
    out = salient_scores(queries, keys)
    torch.testing.assert_close(out, salient_scores_naive(queries, keys), atol=1e-5, rtol=1e-5)
    assert out[:, 1].argmax().item() == 6


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, on the inf and NaN fed on purpose
def test_nan_logits_score_plus_infinity_as_the_torch_path(device):
    queries = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(3)).to(device)
    queries[0, :, 3] = 0.0  # zero against an infinite key element: NaN, read as +inf
    keys = _keys(5, 2, 2, 16, 4, device)
    keys[1, 0, 0, 3] = float("inf")
    keys[2, 0, 1, 5] = float("nan")
    queries[1, 1, 7] = float("nan")
    got, ref = salient_scores(queries, keys), salient_scores_naive(queries, keys)
    assert got[1, 0] == ref[1, 0] == float("inf") and got[2, 0] == ref[2, 0] == float("inf")
    assert (got[:, 1] == float("inf")).all()
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert salient_scores(queries, keys[:0]).shape == (0, 2)


@pytest.mark.parametrize("bad,match", [
    (lambda q, k: (q[0], k), r"queries must be \[layers"),
    (lambda q, k: (q, k[:, :1]), "do not match queries"),
    (lambda q, k: (q[:, :3], k), "3 query rows do not group over 2"),
    (lambda q, k: (q, k.float()), "keys float8_e5m2"),
    (lambda q, k: (q.to(torch.int32), k), "float32, float16 or bfloat16"),
])
def test_salient_scores_refuse_bad_shapes(device, bad, match):
    q, k = torch.randn(2, 4, 8, device=device), _keys(5, 2, 2, 8, 0, device)
    with pytest.raises((ValueError, TypeError), match=match):
        salient_scores(*bad(q, k))
