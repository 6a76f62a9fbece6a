"""chunk_salient: KVFlash's salient-key summaries and scores against their PyTorch references. Summaries (two keys
per chunk, layer and KV head, packed in int4) must equal the torch path's bytes in vLLM's GPU cache layouts and in
caches that keep K apart, on odd sizes (head size, stored dims, tokens, KV heads), chunks longer than a token block,
exact distance ties, and infinite and NaN keys; scores must match within fp32 summation order, on GQA groups, query
windows and strided inputs. Outputs start poisoned, so anything a kernel leaves unwritten fails."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.vllm_kv import LAYOUTS, vllm_cache
from vllm_luce.kernels.chunk_copy import LayerCaches
from vllm_luce.kernels.chunk_copy.naive import gather_tokens_naive
from vllm_luce.kernels.chunk_salient import (row_bytes, salient_decode, salient_keys, salient_keys_naive,
                                             salient_scores, salient_scores_naive)
from vllm_luce.kernels.chunk_salient.naive import pack_int4
from vllm_luce.kernels.scored_dims import ScoredDims as S
from vllm_luce.kvflash.policies import Salient

pytestmark = pytest.mark.kernel

CACHE_LAYOUTS = LAYOUTS + ("split",)  # "split": a [2, blocks, block, kv_heads, head] cache, passed as its K view
POISON = 0xA5


def _caches(layers, blocks, heads, block, d, dtype, device, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    if layout == "split":
        raw = [torch.randn(2, blocks, block, heads, d, generator=g).to(dtype).to(device) for _ in range(layers)]
        return [c[0].transpose(1, 2) for c in raw]
    return [vllm_cache(blocks, heads, block, d, dtype, device, layout, g) for _ in range(layers)]


def _same_packed(got, ref, dims):
    """Equal bytes, but for the scale of a key whose scale is NaN (torch and Triton may write another NaN)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype == torch.uint8
    nan = salient_decode(ref, dims).isnan().any(dim=-1, keepdim=True)  # [..., 1]
    assert torch.equal(salient_decode(got, dims).isnan().any(dim=-1, keepdim=True), nan)
    assert torch.equal(got[..., :-2], ref[..., :-2])
    assert torch.equal(torch.where(nan, 0, got[..., -2:]), torch.where(nan, 0, ref[..., -2:]))


def _set_key(cache, slot, head, value):
    """Write ``value`` as the key of ``head`` at cache ``slot`` (through the cache's strides)."""
    block, offset = divmod(int(slot), cache.shape[2])
    cache[block, head, offset, : len(value)] = value.to(cache.dtype)


# layers, blocks x block size, KV heads, head size, scored dims, dtype, slots
KEY_CASES = [
    (1, 5, 16, 1, 64, S(), torch.bfloat16, 16),
    (3, 7, 16, 3, 128, S(2, 64), torch.float16, 64),  # a 64-token chunk over blocks of 16; all rotated, 2 fast pairs
    (2, 9, 5, 3, 72, S(24), torch.float32, 37),       # odd block size, token count and head count; partial RoPE
    (2, 9, 5, 2, 63, S(16), torch.bfloat16, 37),      # odd head size, 47 stored dims: the last high nibble pads
    (2, 9, 5, 3, 72, S(6, 36), torch.bfloat16, 37),   # the first 6 pairs of each neox half rotate (Gemma 4's way)
    (1, 3, 4, 1, 1, S(), torch.float32, 5),           # head size 1
    (2, 3, 4, 1, 3, S(2), torch.float32, 5),          # one stored dim
    (2, 50, 16, 2, 64, S(16), torch.bfloat16, 600),   # 600 tokens: several token blocks, both keys in late ones
]


@pytest.mark.parametrize("layout", CACHE_LAYOUTS)
@pytest.mark.parametrize("layers,blocks,block,heads,d,scored,dtype,n", KEY_CASES,
                         ids=[f"l{c[0]}-b{c[1]}x{c[2]}-h{c[3]}-d{c[4]}-s{c[5][0]}p{c[5][1]}-{str(c[6])[6:]}-n{c[7]}"
                              for c in KEY_CASES])
def test_salient_keys_equal_the_reference_bytes(device, layout, layers, blocks, block, heads, d, scored, dtype, n):
    caches = _caches(layers, blocks, heads, block, d, dtype, device, layout, seed=n)
    slots = torch.randperm(blocks * block, generator=torch.Generator().manual_seed(d))[:n].to(device)
    if n == 600:  # layer 1, head 0: key 1 in the last token block, key 2 (the opposite way) in the one before
        _set_key(caches[1], slots[-3], 0, torch.full((d,), 13.0, device=device))
        _set_key(caches[1], slots[-300], 0, torch.full((d,), -11.0, device=device))
    dims = scored.count(d)
    out = torch.full((layers, heads, 2, row_bytes(dims)), POISON, dtype=torch.uint8, device=device)
    assert salient_keys(LayerCaches(caches), slots, d, scored, out=out) is out
    ref = salient_keys_naive(caches, slots, d, scored)
    assert ref.shape == out.shape and not salient_decode(ref, dims).isnan().any()
    _same_packed(out, ref, dims)
    keys = gather_tokens_naive(caches, slots)[..., :d]  # [L, T, H, D]: each summary key is one of the chunk's keys
    for layer in range(layers):
        for head in range(heads):
            candidates = pack_int4(keys[layer, :, head, scored.index(d)])  # [T, bytes]
            for key in range(2):
                assert (candidates == out[layer, head, key]).all(dim=-1).any()
    if n == 600:
        assert (out[1, 0, 0, :-2] == 0x77).all() and (out[1, 0, 1, :-2] == 0x99).all()  # 7 and -7 in each nibble
        expected = torch.tensor([13.0, -11.0], device=device)[:, None].expand(2, dims)
        torch.testing.assert_close(salient_decode(out[1, 0], dims), expected, atol=0.01, rtol=0)  # fp16 scales


def test_salient_keys_break_exact_ties_by_the_first_token_and_pack_a_zero_key_as_zeros(device):
    """Distances that tie exactly pick the earliest slot for both keys, as torch's argmax does; a chunk of equal
    keys gives key 1 twice; an all-zero key has scale 0 and decodes to zeros."""
    caches = [torch.zeros(4, 2, 8, 2 * 6, device=device)]
    slots = torch.tensor([9, 3, 17, 0, 25, 8, 12, 30, 2], device=device)
    e1, e2 = torch.eye(6, device=device)[0] * 3.5, torch.eye(6, device=device)[1] * 3.5  # scale 0.5: exact
    for position, value in ((2, e1), (5, -e1), (7, e2), (8, -e2)):  # mean 0, all four equally far
        _set_key(caches[0], slots[position], 0, value)
    got = salient_keys(LayerCaches(caches), slots, 6)
    ref = salient_keys_naive(caches, slots, 6)
    assert torch.equal(got, ref)
    decoded = salient_decode(got, 6)
    assert torch.equal(decoded[0, 0, 0], e1) and torch.equal(decoded[0, 0, 1], -e1)  # slot order 2, then 5
    assert torch.equal(got[0, 1], torch.zeros_like(got[0, 1]))  # head 1: every key zero, scale 0
    assert torch.equal(decoded[0, 1], torch.zeros(2, 6, device=device))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, on the inf and NaN fed on purpose
def test_salient_keys_with_infinite_and_nan_keys_pick_and_pack_as_the_torch_path(device):
    """A NaN or infinite key makes the mean, hence every distance to it, NaN (read as +inf) or infinite: the first
    token is key 1. Key 2 is the first too, but where the infinite key's own distance is NaN and the others' to key 1
    finite: then it is the infinite key. A chosen key with a NaN or infinite stored element decodes to NaN; one whose
    infinity lies in the rotated dims alone, which are not stored, packs as usual."""
    caches = _caches(2, 4, 4, 8, 16, torch.bfloat16, device, "NHD", seed=5)
    slots = torch.tensor([8, 13, 9, 10, 16, 0, 7, 1], device=device)  # blocks 1, 2 and 0
    nan, inf = torch.full((16,), float("nan")), torch.full((16,), float("inf"))
    _set_key(caches[0], 10, 2, nan)
    _set_key(caches[1], 16, 1, inf)
    _set_key(caches[0], 8, 3, torch.tensor([1.0] * 15 + [float("nan")]))  # the first token: NaN in a stored dim
    _set_key(caches[1], 8, 3, torch.tensor([float("inf")] + [1.0] * 15))  # the first token: inf in a rotated dim
    got = salient_keys(LayerCaches(caches), slots, 16, S(4))
    ref = salient_keys_naive(caches, slots, 16, S(4))
    _same_packed(got, ref, 12)
    decoded = salient_decode(got, 12)
    first = gather_tokens_naive(caches, slots[:1])[:, 0, :, 4:16]  # [L, H, 12]
    for layer, head, keys in ((0, 2, (0, 1)), (1, 3, (0, 1)), (0, 3, (0, 1)), (1, 1, (0,))):
        for key in keys:
            torch.testing.assert_close(decoded[layer, head, key], salient_decode(pack_int4(first[layer, head]), 12),
                                       atol=0, rtol=0, equal_nan=True)
    assert decoded[0, 3].isnan().all() and decoded[1, 1, 1].isnan().all() and not decoded[1, 3].isnan().any()


def test_salient_keys_refuse_fp8_caches_and_bad_outputs(device):
    caches = _caches(1, 2, 2, 4, 8, torch.float32, device, "HND")
    with pytest.raises(TypeError, match="fp8 caches take the torch path"):
        salient_keys(LayerCaches([c.to(torch.float8_e4m3fn) for c in caches]), torch.arange(4, device=device), 8)
    with pytest.raises(ValueError, match="out must be"):
        salient_keys(LayerCaches(caches), torch.arange(4, device=device), 8, out=torch.empty(1, 2, 2, 8))
    with pytest.raises(ValueError, match="non-empty"):
        salient_keys(LayerCaches(caches), torch.arange(0, device=device), 8)
    with pytest.raises(ValueError, match="scored dims"):
        salient_keys(LayerCaches(caches), torch.arange(4, device=device), 8, S(8))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kvflash_store_salient_keys_through_the_kernel_equal_the_torch_path(device, layout):
    """PagedPoolStore.salient_keys with the one-launch mover (what a GPU runs) equals its torch path, and is what
    Salient summarises, for 32-token chunks straddling blocks of 5, with and without rotated dims."""
    from vllm_luce.kvflash.kv_store import PACKED_LAYOUT, PagedPoolStore

    def store():
        s = PagedPoolStore(_caches(3, 17, 2, 5, 40, torch.bfloat16, device, layout, 4), PACKED_LAYOUT, 40, 5, 32)
        s.row = np.random.default_rng(0).permutation(17)[:13]
        return s

    fused, plain = store(), store()
    fused.mover, plain.mover = LayerCaches(fused.views), None  # a GPU store makes its mover itself
    for scored, position in ((S(), 0), (S(10), 1), (S(2, 20), 1)):
        got = Salient(scored=scored).summarize(fused, position)
        assert got.shape == (3, 2, 2, row_bytes(scored.count(40))) and got.dtype == torch.uint8
        assert torch.equal(got, Salient(scored=scored).summarize(plain, position))


def _summaries(chunks, layers, hkv, dims, seed, device):
    g = torch.Generator().manual_seed(seed)
    return pack_int4(torch.randn(chunks, layers, hkv, 2, dims, generator=g) * 2).to(device)


# chunks, layers, query rows, KV heads, head size, scored dims, query dtype
SCORE_CASES = [
    (1, 1, 1, 1, 1, S(), torch.float32),
    (37, 3, 12, 3, 64, S(16), torch.float32),    # groups of 4 over 3 KV heads; 37 chunks span two blocks
    (5, 2, 8, 8, 128, S(2, 64), torch.bfloat16),  # no grouping; all rotated, less the 2 fastest pairs
    (9, 2, 32, 1, 128, S(), torch.float16),      # one KV head, 4 heads x a window of 8 tokens
    (3, 1, 6, 2, 81, S(16), torch.bfloat16),     # odd head size, 65 stored dims
    (4, 2, 9, 3, 33, S(), torch.float32),        # odd group (3) over 3 KV heads, 33 stored dims
    (6, 2, 8, 2, 96, S(8, 24), torch.float32),   # 4 periods of 24, 16 kept in each
]


@pytest.mark.parametrize("chunks,layers,hq,hkv,d,scored,dtype", SCORE_CASES,
                         ids=[f"c{c[0]}-l{c[1]}-{c[2]}q{c[3]}kv-d{c[4]}-s{c[5][0]}p{c[5][1]}-{str(c[6])[6:]}"
                              for c in SCORE_CASES])
def test_salient_scores_match_the_reference(poisoned, device, chunks, layers, hq, hkv, d, scored, dtype):
    queries = torch.randn(layers, hq, d, generator=torch.Generator().manual_seed(chunks * 7 + d)).to(dtype).to(device)
    summaries = _summaries(chunks, layers, hkv, scored.count(d), chunks + d, device)
    out = poisoned((chunks, layers))
    assert salient_scores(queries, summaries, scored, out=out) is out
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, salient_scores_naive(queries, summaries, scored), atol=1e-5, rtol=1e-5)


def test_salient_scores_read_strided_summaries_and_take_either_key_of_the_group(device):
    """Summaries as a strided view (a slice of a larger table, layers and KV heads transposed); a second key that a
    query row of its own group points at sets that chunk's score for that layer; the dims left out are not read."""
    layers, hq, hkv, d, scored, chunks = 2, 8, 4, 32, S(4, 16), 11
    kept, left_out = scored.index(d), torch.tensor([0, 1, 2, 3, 16, 17, 18, 19])
    table = _summaries(chunks + 4, hkv, layers, scored.count(d), 1, device).transpose(1, 2)  # [.., Hkv, layers, ..]
    summaries = table[4:]  # [chunks, layers, hkv, 2, bytes], not contiguous
    queries = torch.randn(layers, 2 * hq, d, generator=torch.Generator().manual_seed(2)).to(device)[:, ::2]
    summaries[6, 1, 5 // 2, 1] = pack_int4(queries[1, 5, kept.to(device)] * 8)  # row 5 belongs to KV head 2
    out = salient_scores(queries, summaries, scored)
    torch.testing.assert_close(out, salient_scores_naive(queries, summaries, scored), atol=1e-5, rtol=1e-5)
    assert out[:, 1].argmax().item() == 6
    queries[..., left_out.to(device)] = float("nan")  # never read
    torch.testing.assert_close(salient_scores(queries, summaries, scored), out, atol=0, rtol=0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, on the inf and NaN fed on purpose
def test_nan_logits_score_plus_infinity_as_the_torch_path(device):
    """A key with a NaN or infinite scale decodes to NaN, a NaN query row makes its logits NaN: +inf. A zero key
    (scale 0) scores 0."""
    queries = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(3)).to(device)
    summaries = _summaries(5, 2, 2, 16, 4, device)
    keys = torch.randn(5, 2, 2, 2, 16, generator=torch.Generator().manual_seed(4))
    keys[1, 0, 0, 1, 3] = float("inf")
    keys[2, 0, 1, 0, 5] = float("nan")
    keys[3] = 0.0
    summaries = pack_int4(keys).to(device)
    queries[1, 1, 7] = float("nan")
    got, ref = salient_scores(queries, summaries), salient_scores_naive(queries, summaries)
    assert got[1, 0] == ref[1, 0] == float("inf") and got[2, 0] == ref[2, 0] == float("inf")
    assert (got[:, 1] == float("inf")).all()
    assert got[3, 0] == ref[3, 0] == 0.0
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert salient_scores(queries, summaries[:0]).shape == (0, 2)


@pytest.mark.parametrize("bad,match", [
    (lambda q, k: (q[0], k, S()), r"queries must be \[layers"),
    (lambda q, k: (q, k[:, :1], S()), "do not match queries"),
    (lambda q, k: (q, k, S(2)), "do not match queries"),
    (lambda q, k: (q, k, S(8)), "scored dims"),
    (lambda q, k: (q, k, S(1, 4)), "scored dims"),  # runs of 3: odd
    (lambda q, k: (q[:, :3], k, S()), "3 query rows do not group over 2"),
    (lambda q, k: (q, k.float(), S()), "summaries uint8"),
    (lambda q, k: (q.to(torch.int32), k, S()), "float32, float16 or bfloat16"),
])
def test_salient_scores_refuse_bad_shapes(device, bad, match):
    q, k = torch.randn(2, 4, 8, device=device), _summaries(5, 2, 2, 8, 0, device)
    with pytest.raises((ValueError, TypeError), match=match):
        salient_scores(*bad(q, k))
