"""pooled_attention (decode) and pooled_attention_varlen (chunked prefill): the Triton kernels against
the plain PyTorch reference, and against SDPA when the pool holds the whole context. Outputs are
NaN-poisoned; sizes are small and odd. bf16 tolerance is flash attention's: P is rounded to bf16."""

from __future__ import annotations

import pytest
import torch

from vllm_luce.kernels.pooled_attention import (pooled_attention, pooled_attention_naive, pooled_attention_varlen,
                                                pooled_attention_varlen_naive)

pytestmark = pytest.mark.kernel


def make_case(B=3, Hq=6, Hkv=2, D=80, chunk=16, slots=23, seq_lens=(70, 33, 1), dtype=torch.bfloat16, seed=0,
              device="cpu"):
    """Each request's chunks sit in shuffled slots of one shared pool; the last chunk is partial."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, D, generator=g).to(dtype)
    k = torch.randn(slots, chunk, Hkv, D, generator=g).to(dtype)
    v = torch.randn(slots, chunk, Hkv, D, generator=g).to(dtype)
    perm = torch.randperm(slots, generator=g).tolist()
    entries = max(-(-n // chunk) for n in seq_lens) + 1  # one unused (-1) entry at least
    slot_table = torch.full((B, entries), -1, dtype=torch.int32)
    chunk_pos = torch.zeros(B, entries, dtype=torch.int32)
    for b, n in enumerate(seq_lens):
        chunks = list(range(-(-n // chunk)))
        order = torch.randperm(len(chunks), generator=g).tolist()  # page table in any order
        for i, c in enumerate(order):
            slot_table[b, i] = perm.pop()
            chunk_pos[b, i] = c * chunk
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    return tuple(t.to(device) for t in (q, k, v, slot_table, chunk_pos, lens))


def cpu(*tensors):
    return [t.cpu() for t in tensors]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("window", [None, 20])
@pytest.mark.parametrize("splits", [1, 3])
def test_matches_the_reference(dtype, tol, window, splits, device, poisoned):
    case = make_case(dtype=dtype, device=device)
    out = pooled_attention(*case, scale=80 ** -0.5, window=window, out=poisoned((3, 6, 80)), num_splits=splits).cpu()
    ref = pooled_attention_naive(*cpu(*case), scale=80 ** -0.5, window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("Hq, Hkv, D, chunk", [(4, 4, 64, 8), (8, 1, 128, 32), (3, 1, 200, 16)])
def test_shapes_gqa_and_head_dims(Hq, Hkv, D, chunk, device, poisoned):
    case = make_case(B=2, Hq=Hq, Hkv=Hkv, D=D, chunk=chunk, slots=17, seq_lens=(chunk * 3 - 1, 5),
                     dtype=torch.float32, seed=1, device=device)
    out = pooled_attention(*case, scale=0.1, out=poisoned((2, Hq, D)), num_splits=2).cpu()
    torch.testing.assert_close(out, pooled_attention_naive(*cpu(*case), scale=0.1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_n", [16, 32, 128])
def test_key_tiles_within_a_chunk(block_n, device, poisoned):
    """A key tile covers part of a 32-row chunk (16) or all of it (32; 128 is capped at the chunk)."""
    case = make_case(B=2, Hq=4, Hkv=2, D=64, chunk=32, slots=13, seq_lens=(150, 37), dtype=torch.float32, seed=2,
                     device=device)
    out = pooled_attention(*case, scale=0.1, out=poisoned((2, 4, 64)), num_splits=2, block_n=block_n).cpu()
    torch.testing.assert_close(out, pooled_attention_naive(*cpu(*case), scale=0.1), rtol=1e-5, atol=1e-5)


def test_whole_context_in_the_pool_equals_plain_attention(device, poisoned):
    """Slots holding the full context in any order give ordinary causal attention of the last token."""
    case = make_case(B=1, Hq=6, Hkv=2, D=64, chunk=16, slots=9, seq_lens=(75,), dtype=torch.float32, device=device)
    out = pooled_attention(*case, scale=0.125, out=poisoned((1, 6, 64))).cpu()
    q, k, v, st, cp, lens = cpu(*case)
    order = torch.argsort(cp[0, :5])
    keys = k[st[0, order].long()].reshape(-1, 2, 64)[:75]  # logical order
    vals = v[st[0, order].long()].reshape(-1, 2, 64)[:75]
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        q[:, :, None, :], keys.permute(1, 0, 2)[None], vals.permute(1, 0, 2)[None], scale=0.125, enable_gqa=True)
    torch.testing.assert_close(out, sdpa[:, :, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("splits", [1, 4])
def test_a_request_with_nothing_visible_gets_zeros(splits, device, poisoned):
    q, k, v, st, cp, lens = make_case(B=2, seq_lens=(40, 20), dtype=torch.float32, device=device)
    lens[1] = 0
    out = pooled_attention(q, k, v, st, cp, lens, scale=0.1, out=poisoned((2, 6, 80)), num_splits=splits).cpu()
    assert torch.isfinite(out).all() and torch.equal(out[1], torch.zeros(6, 80))


def test_bad_shapes_are_refused(device):
    q, k, v, st, cp, lens = make_case(dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="do not group"):
        pooled_attention(q[:, :5], k, v, st, cp, lens, scale=0.1)
    with pytest.raises(ValueError, match="power of two"):
        pooled_attention(q, k[:, :15], v[:, :15], st, cp, lens, scale=0.1)
    with pytest.raises(ValueError, match="share one float dtype"):
        pooled_attention(q.double(), k.double(), v.double(), st, cp, lens, scale=0.1)
    with pytest.raises(ValueError, match="q_pos must be"):
        pooled_attention_varlen(q, k, v, torch.arange(4, device=device), lens[:2], st, cp, scale=0.1)


def prefill_case(q_lens, seq_lens, Hq=6, Hkv=2, D=48, chunk=16, dtype=torch.float32, seed=3, device="cpu"):
    """Request b's last q_lens[b] tokens (positions seq_lens[b] - q_lens[b] ..) attend to its pool, which
    already holds their own keys (written before attention, as vLLM does)."""
    q1, k, v, st, cp, lens = make_case(B=len(q_lens), Hq=Hq, Hkv=Hkv, D=D, chunk=chunk, slots=31, seq_lens=seq_lens,
                                       dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    q = torch.randn(sum(q_lens), Hq, D, generator=g).to(dtype)
    starts = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q_pos = torch.cat([torch.arange(n - t, n) for t, n in zip(q_lens, seq_lens)]).to(torch.int32)
    return tuple(t.to(device) for t in (q, k, v, starts, q_pos, st, cp))


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("window", [None, 19])
@pytest.mark.parametrize("splits", [1, 2])
def test_chunked_prefill_matches_the_reference(dtype, tol, window, splits, device, poisoned):
    """Three requests with 37, 1 and 0 new tokens over pools of 70, 33 and 5 positions."""
    case = prefill_case((37, 1, 0), (70, 33, 5), dtype=dtype, device=device)
    out = pooled_attention_varlen(*case, scale=48 ** -0.5, window=window, out=poisoned((38, 6, 48)),
                                  num_splits=splits).cpu()
    ref = pooled_attention_varlen_naive(*cpu(*case), scale=48 ** -0.5, window=window)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("Hq, Hkv, D, chunk", [(8, 1, 64, 8), (2, 2, 200, 32), (3, 3, 512, 16)])
def test_chunked_prefill_group_sizes_and_wide_heads(Hq, Hkv, D, chunk, device, poisoned):
    """Groups larger than a tile's share, head dims up to 512 and chunks smaller than a key tile."""
    case = prefill_case((21, 9), (40, 9), Hq=Hq, Hkv=Hkv, D=D, chunk=chunk, device=device)
    out = pooled_attention_varlen(*case, scale=0.05, out=poisoned((30, Hq, D))).cpu()
    torch.testing.assert_close(out, pooled_attention_varlen_naive(*cpu(*case), scale=0.05), rtol=1e-5, atol=1e-5)


def test_chunked_prefill_over_the_whole_context_equals_causal_sdpa(device, poisoned):
    """A pool holding the whole sequence in shuffled slots gives ordinary causal attention of its last
    30 tokens (the query block sits at the end: SDPA's bottom-right causal alignment)."""
    q, k, v, starts, q_pos, st, cp = prefill_case((30,), (75,), D=64, device=device)
    out = pooled_attention_varlen(q, k, v, starts, q_pos, st, cp, scale=0.125, out=poisoned((30, 6, 64))).cpu()
    q, k, v, st, cp = cpu(q, k, v, st, cp)
    order = torch.argsort(cp[0, :5])
    keys = k[st[0, order].long()].reshape(-1, 2, 64)[:75].permute(1, 0, 2)[None]
    vals = v[st[0, order].long()].reshape(-1, 2, 64)[:75].permute(1, 0, 2)[None]
    mask = torch.arange(75)[None, :] <= torch.arange(45, 75)[:, None]
    sdpa = torch.nn.functional.scaled_dot_product_attention(q.permute(1, 0, 2)[None], keys, vals, attn_mask=mask,
                                                            scale=0.125, enable_gqa=True)
    torch.testing.assert_close(out, sdpa[0].permute(1, 0, 2), rtol=1e-5, atol=1e-5)


def test_decode_is_prefill_with_one_token(device, poisoned):
    q, k, v, st, cp, lens = make_case(dtype=torch.float32, device=device)
    dec = pooled_attention(q, k, v, st, cp, lens, scale=0.1, out=poisoned((3, 6, 80)))
    starts = torch.arange(4, dtype=torch.int32, device=device)
    pre = pooled_attention_varlen(q, k, v, starts, lens - 1, st, cp, scale=0.1, out=poisoned((3, 6, 80)))
    torch.testing.assert_close(dec, pre, rtol=0, atol=0)
