"""PagedPoolStore over vLLM-layout KV caches: chunk read/write/rearrange are bit-exact in both layouts,
and on a GPU the side-stream host copies are safe when the slot is overwritten right after page-out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fixtures.vllm_kv import LAYOUTS, vllm_cache, vllm_keys_values
from vllm_luce.kvflash.kv_store import CPU_LAYOUT, PACKED_LAYOUT, PagedPoolStore

LAYERS, HEADS, HEAD, BLOCK, CHUNK, BLOCKS = 3, 2, 8, 16, 32, 12


def caches(layout, device="cpu", seed=0, gpu_layout="NHD"):
    """CPU_LAYOUT: vLLM's CPU backend tensor; PACKED_LAYOUT: a GPU backend's, in ``gpu_layout``."""
    g = torch.Generator().manual_seed(seed)
    if layout is CPU_LAYOUT:
        return [torch.randn(BLOCKS, HEADS, BLOCK, 2 * HEAD, generator=g).to(torch.bfloat16).to(device)
                for _ in range(LAYERS)]
    return [vllm_cache(BLOCKS, HEADS, BLOCK, HEAD, device=device, layout=gpu_layout, generator=g)
            for _ in range(LAYERS)]


def store(layout, device="cpu", gpu_layout="NHD"):
    s = PagedPoolStore(caches(layout, device, gpu_layout=gpu_layout), layout, HEAD, BLOCK, CHUNK)
    s.row = np.array([7, 2, 9, 0, 11, 4])  # the request's blocks, scattered: 3 chunks of 32 tokens
    return s


def token_keys(s, slot):
    """K of one linear cache slot, every layer, read straight from the caches (not through the store)."""
    b, o = divmod(slot, BLOCK)
    if s.layout is CPU_LAYOUT:  # K then V by token (the identity element map)
        return [v.view(v.shape[0], v.shape[1], 2, BLOCK, HEAD)[b, :, 0, o] for v in s.views]
    return [vllm_keys_values(v, HEAD)[0][b, o] for v in s.views]  # what FlashAttention reads


def chunk_key(s, layer_data, t):
    """K of the chunk's token t in read()'s token form ([T, heads, 2, head] cpu; [T, heads, 2 * head] packed)."""
    return layer_data[t, :, 0] if s.layout is CPU_LAYOUT else layer_data[t, :, :HEAD]


STORES = [(CPU_LAYOUT, "NHD")] + [(PACKED_LAYOUT, g) for g in LAYOUTS]
STORE_IDS = ["cpu"] + [f"packed-{g}" for g in LAYOUTS]


@pytest.mark.parametrize("layout,gpu_layout", STORES, ids=STORE_IDS)
def test_read_write_and_rearrange_are_bit_exact(layout, gpu_layout):
    s = store(layout, gpu_layout=gpu_layout)
    first, second = s.read(0).clone(), s.read(2).clone()
    host = s.read_host(0)
    assert host.shape[0] == LAYERS and torch.equal(host.view(torch.int16), first.view(torch.int16))
    slot = int(s.slots([2 * CHUNK + 5])[0])
    assert all(torch.equal(k, chunk_key(s, first[i], 5)) for i, k in enumerate(token_keys(s, int(s.slots([5])[0]))))
    s.rearrange([(0, 2)], [(2, host)])  # swap chunks 0 and 2 through a move and a load
    assert torch.equal(s.read(0).view(torch.int16), second.view(torch.int16))
    assert torch.equal(s.read(2).view(torch.int16), first.view(torch.int16))
    assert all(torch.equal(k, chunk_key(s, first[i], 5)) for i, k in enumerate(token_keys(s, slot)))


@pytest.mark.parametrize("layout,gpu_layout", STORES, ids=STORE_IDS)
def test_a_compacting_shift_reads_every_source_before_writing(layout, gpu_layout):
    """An eviction shifts the chunks behind it down one position: each move's destination is the next one's
    source, and the moves run as one gather and one scatter."""
    s = store(layout, gpu_layout=gpu_layout)
    chunks = [s.read(p).clone() for p in range(3)]
    page = torch.randn(chunks[0].shape, generator=torch.Generator().manual_seed(5)).to(chunks[0].dtype)
    s.rearrange([(0, 1), (1, 2)], [(2, page)])
    for position, expected in enumerate([chunks[1], chunks[2], page]):
        assert torch.equal(s.read(position).view(torch.int16), expected.view(torch.int16)), position


@pytest.mark.parametrize("gpu_layout", LAYOUTS)
def test_packed_writes_land_where_flash_attention_reads(gpu_layout):
    """A chunk written through the store is, token by token, FlashAttention's K and V view of the cache
    (in vLLM's own tensor, never a copy), and no other slot changes."""
    s = store(PACKED_LAYOUT, gpu_layout=gpu_layout)
    before = [c.clone() for c in s.views]
    data = torch.randn(s.read(1).shape, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    s.write(1, data)  # pool position 1 = offsets 32..63 = blocks row[2], row[3] = 9, 0
    for layer, cache in enumerate(s.views):
        keys, values = vllm_keys_values(cache, HEAD)
        for t in range(CHUNK):
            b, o = divmod(int(s.slots([CHUNK + t])[0]), BLOCK)
            assert torch.equal(keys[b, o], data[layer, t, :, :HEAD]) and torch.equal(values[b, o], data[layer, t, :, HEAD:])
        touched = torch.zeros(BLOCKS, BLOCK, dtype=torch.bool)
        touched[[9, 0]] = True
        old_k, old_v = vllm_keys_values(before[layer], HEAD)
        assert torch.equal(keys[~touched], old_k[~touched]) and torch.equal(values[~touched], old_v[~touched])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="side-stream host copies need a CUDA device")
def test_page_out_on_the_copy_stream_survives_an_immediate_overwrite():
    """Page out, overwrite the slot on the compute stream at once, page in elsewhere: the bytes that come
    back are the ones paged out, for 50 rounds of large chunks (so copies are still in flight)."""
    s = PagedPoolStore([vllm_cache(512, 8, 16, 128, device="cuda") for _ in range(36)], PACKED_LAYOUT, 128, 16, 64)
    s.row = np.random.default_rng(0).permutation(512)[:128]  # 32 chunks
    for r in range(50):
        expected = s.read(r % 16).clone()
        host = s.read_host(r % 16)
        s.write(r % 16, torch.full_like(expected, float(r)))  # the slot is reused immediately
        s.write(16 + r % 16, host)
        assert torch.equal(s.read(16 + r % 16).view(torch.int16), expected.view(torch.int16)), r
    s.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="side-stream host copies need a CUDA device")
def test_page_ins_on_their_own_stream_read_what_was_paged_out_while_pool_views_are_reused():
    """Page-ins run on a stream of their own, after their own page-out only: the bytes that come back are the ones
    paged out even when the host view goes back to its pool at once and the next page-out takes views (50 rounds,
    copies still in flight, a pool of 4 chunk views)."""
    from vllm_luce.kvflash.host_pool import PinnedChunkPool

    s = PagedPoolStore([vllm_cache(512, 8, 16, 128, device="cuda") for _ in range(36)], PACKED_LAYOUT, 128, 16, 64)
    s.row = np.random.default_rng(1).permutation(512)[:128]  # 32 chunks
    pools = {}

    def host_pool(shape, dtype):
        if (shape, dtype) not in pools:
            pools[shape, dtype] = PinnedChunkPool(shape, dtype, s.copy_stream, slab_bytes=4 * 36 * 2 * 64 * 8 * 128 * 2)
            pools[shape, dtype].reserve(1)  # one slab of 4 views: the rest go to pageable memory
        return pools[shape, dtype]

    s.host_pool = host_pool
    for r in range(50):
        expected = s.read(r % 16).clone()
        host = s.read_host(r % 16)
        s.write(r % 16, torch.full_like(expected, float(r)))
        s.write(16 + r % 16, host)
        del host  # back to the pool while its page-in may still read it
        spare = [s.read_host((r + k) % 16) for k in range(1, 4)]  # page-outs that take views again
        assert torch.equal(s.read(16 + r % 16).view(torch.int16), expected.view(torch.int16)), r
        del spare
    s.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="side-stream host copies need a CUDA device")
def test_a_page_out_without_a_free_pinned_view_goes_to_pageable_memory_bit_exact():
    """With every pinned view in use, a page-out copies to pageable memory at once; the bytes page back in."""
    s = PagedPoolStore([vllm_cache(512, 8, 16, 128, device="cuda") for _ in range(4)], PACKED_LAYOUT, 128, 16, 64)
    s.row = np.random.default_rng(2).permutation(512)[:128]

    class Empty:
        misses = 0

        def take(self):
            self.misses += 1
            return None

    empty = Empty()
    s.host_pool = lambda shape, dtype: empty
    expected = s.read(3).clone()
    host = s.read_host(3)
    assert not host.is_pinned() and empty.misses == 1
    s.write(3, torch.zeros_like(expected))
    s.write(5, host)
    assert torch.equal(s.read(5).view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize("layout,gpu_layout", STORES, ids=STORE_IDS)
def test_keys_at_reads_each_chunks_keys_straight_from_the_caches(layout, gpu_layout):
    s = store(layout, gpu_layout=gpu_layout)
    keys = s.keys_at([2, 0])  # [chunks, layers, tokens, heads, head]
    assert keys.shape == (2, LAYERS, CHUNK, HEADS, HEAD)
    for i, position in enumerate([2, 0]):
        for t in (0, 5, CHUNK - 1):
            slot = int(s.slots([position * CHUNK + t])[0])
            for layer, expected in enumerate(token_keys(s, slot)):
                assert torch.equal(keys[i, layer, t], expected)


NO_AMX = pytest.mark.skipif(not torch.cpu._is_amx_tile_supported(), reason="vLLM runs its amx kernel only on AMX CPUs")


@pytest.mark.parametrize("isa", ["vec", "vec16", pytest.param("amx", marks=NO_AMX)])
def test_cpu_chunks_move_as_if_vllms_kernel_had_written_their_tokens_there(isa):
    """vLLM's CPU kernels do not store a block's K row-major (``vec`` stores it transposed, ``amx``
    interleaves pairs): chunks must move by the probed element map, or moving a chunk would move a
    band of head dims of every token in the block. Reference: the kernel writing the same tokens at
    the chunk's new slots."""
    ops = pytest.importorskip("vllm._custom_ops", reason="the reference is vLLM's CPU kernel")
    if not hasattr(torch.ops._C, "cpu_attn_reshape_and_cache"):
        pytest.skip("the reference is vLLM's CPU kernel, which a GPU build of vLLM does not carry")
    from vllm_luce.kvflash.cache_layout import probe_cpu_elements

    block, head, heads, chunk = 64, 32, 2, 16
    elements = probe_cpu_elements(isa, block, head, torch.bfloat16)
    layout = CPU_LAYOUT.with_elements(elements)
    g = torch.Generator().manual_seed(1)
    k, v = (torch.randn(4 * block, heads, head, generator=g).to(torch.bfloat16) for _ in range(2))

    def written(slots):
        cache = torch.zeros(4, heads, block, 2 * head, dtype=torch.bfloat16)
        key_cache, value_cache = cache.view(4, heads, 2 * block, head).chunk(2, dim=2)
        ops.cpu_attn_reshape_and_cache(k[: len(slots)].contiguous(), v[: len(slots)].contiguous(), key_cache,
                                       value_cache, torch.as_tensor(slots, dtype=torch.int64), isa)
        return cache

    cache = written(list(range(2 * chunk)))  # tokens 0..31 at slots 0..31: pool positions 0 and 1
    s = PagedPoolStore([cache], layout, head, block, chunk)
    s.row = np.array([0, 1, 2, 3])
    keys = s.keys_at([1])[0, 0]  # [chunk, heads, head]
    assert torch.equal(keys, k[chunk: 2 * chunk])
    s.rearrange([(5, 1), (6, 0)], [])  # chunk 1 -> position 5 (block 1), chunk 0 -> position 6
    k, v = torch.cat([k[chunk: 2 * chunk], k[:chunk]]), torch.cat([v[chunk: 2 * chunk], v[:chunk]])
    expected = written(list(range(5 * chunk, 7 * chunk)))  # tokens 16..31 then 0..15 at slots 80..111
    assert torch.equal(cache[1].view(torch.int16), expected[1].view(torch.int16))
