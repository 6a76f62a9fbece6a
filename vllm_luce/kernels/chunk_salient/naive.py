"""Plain PyTorch references of chunk_salient, written for clarity rather than speed. ``salient_from_keys`` and
``salient_scores_naive`` are the torch paths of ``policies.Salient``.

The summary of one (chunk, layer, KV head) is two of the chunk's keys, packed as uint8 ``[2, row_bytes(dims)]``:
* key 1: the key farthest (squared Euclidean distance over all head dims, fp32) from the chunk's mean key;
* key 2: the key farthest from both, i.e. maximising ``min(distance to the mean, distance to key 1)``
  (farthest-point selection).
The first token wins a tie; a NaN distance counts as +inf (a NaN in either distance makes their minimum NaN). A NaN
or infinite key makes the mean, hence every distance to it, NaN or infinite, and the first token is chosen.

Only the scored dims are kept (``ScoredDims``: where RoPE rotates part of each head, the dims it leaves alone; where
it rotates all of it, all but the two fastest-rotating pairs), in int4, symmetric per key: ``scale = fp16(max |x| / 7)`` over the kept dims, ``q = clamp(round_half_even(x / scale), -7,
7)``, where a NaN quotient (a NaN key element, or a NaN or infinite scale) gives 0 and a zero scale gives all 0.
The key decodes to ``q * scale``: a zero key to zeros, a key with a NaN or infinite element (or beyond fp16's
range) to NaN. A row holds the values two to a byte, element ``2j`` in the low nibble of byte ``j`` and ``2j + 1``
in the high one (two's complement; an odd ``dims`` leaves the last high nibble 0), then the fp16 scale's two bytes,
little-endian.
"""

from __future__ import annotations

import torch

from vllm_luce.kernels.chunk_copy.naive import gather_tokens_naive
from vllm_luce.kernels.scored_dims import ScoredDims

KEYS = 2  # summary keys per chunk, layer and KV head


def row_bytes(dims: int) -> int:
    """Bytes of one packed key of ``dims`` scored dims: the int4 values two to a byte, then the fp16 scale."""
    return (dims + 1) // 2 + 2


def _first_farthest(dist: torch.Tensor) -> torch.Tensor:
    """[L, T, H] distances -> [L, H] token index of the first largest, a NaN distance counting as +inf."""
    return torch.where(dist.isnan(), float("inf"), dist).argmax(dim=1)  # torch gives the first maximum


def _take(keys: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
    """keys [L, T, H, D], pick [L, H] -> [L, H, D]."""
    return torch.gather(keys, 1, pick[:, None, :, None].expand(-1, 1, -1, keys.shape[-1]))[:, 0]


def salient_pair(keys: torch.Tensor) -> torch.Tensor:
    """keys [layers, tokens, kv_heads, head] -> [layers, kv_heads, 2, head] fp32: key 1 and key 2, unquantised."""
    k = keys.float()
    to_mean = (k - k.mean(dim=1, keepdim=True)).square().sum(dim=-1)  # [L, T, H]
    first = _take(k, _first_farthest(to_mean))
    to_first = (k - first[:, None]).square().sum(dim=-1)
    second = _take(k, _first_farthest(torch.minimum(to_mean, to_first)))  # torch.minimum keeps a NaN
    return torch.stack([first, second], dim=2)


def pack_int4(x: torch.Tensor) -> torch.Tensor:
    """[..., dims] float -> [..., row_bytes(dims)] uint8: symmetric int4 per row with its fp16 scale."""
    x = x.float()
    scale = (x.abs().amax(dim=-1, keepdim=True) / 7).half()  # a NaN element makes it NaN
    s = scale.float()
    q = torch.where(s == 0, 0.0, x / s).nan_to_num(nan=0.0)
    nibbles = (q.round().clamp(-7, 7).to(torch.int8) & 0xF).to(torch.uint8)
    if nibbles.shape[-1] % 2:
        nibbles = torch.cat([nibbles, torch.zeros_like(nibbles[..., :1])], dim=-1)
    values = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    return torch.cat([values, scale.contiguous().view(torch.uint8)], dim=-1)


def salient_decode(packed: torch.Tensor, dims: int) -> torch.Tensor:
    """[..., row_bytes(dims)] uint8 -> [..., dims] fp32: ``q * scale`` of each packed key."""
    if packed.dtype != torch.uint8 or packed.shape[-1] != row_bytes(dims):
        raise ValueError(f"salient_decode: expected [..., {row_bytes(dims)}] uint8 for {dims} dims, got "
                         f"{list(packed.shape)} {packed.dtype}")
    values = packed[..., :-2].to(torch.int16)
    nibbles = torch.stack([values & 0xF, values >> 4], dim=-1).flatten(-2)[..., :dims]
    q = torch.where(nibbles >= 8, nibbles - 16, nibbles).float()
    scale = packed[..., -2:].clone().view(torch.float16).float()  # [..., 1]; a copy: its own storage, aligned
    return q * scale


def salient_from_keys(keys: torch.Tensor, scored: ScoredDims = ScoredDims()) -> torch.Tensor:
    """keys [layers, tokens, kv_heads, head] -> [layers, kv_heads, 2, row_bytes(scored.count(head))] uint8: key 1 and
    key 2 of each layer and KV head, their ``scored`` dims packed as int4."""
    head = keys.shape[-1]
    scored.check("salient_from_keys", head)
    return pack_int4(salient_pair(keys)[..., scored.index(head)])


def salient_keys_naive(caches: list[torch.Tensor], slots: torch.Tensor, head_dim: int,
                       scored: ScoredDims = ScoredDims()) -> torch.Tensor:
    """``salient_from_keys`` of the keys at cache ``slots`` (the first ``head_dim`` elements of each head's row in a
    ``[blocks, kv_heads, block_size, width]`` cache)."""
    return salient_from_keys(gather_tokens_naive(caches, slots)[..., :head_dim], scored)


def salient_scores_naive(queries: torch.Tensor, summaries: torch.Tensor,
                         scored: ScoredDims = ScoredDims()) -> torch.Tensor:
    """queries [L, Hq, D], summaries [C, L, Hkv, 2, row_bytes(scored.count(D))] uint8 -> [C, L] fp32: per layer, the
    max over both keys and each KV head's group of query rows of ``q . k / sqrt(D)``, ``q`` restricted to the
    ``scored`` dims; a NaN logit counts as +inf."""
    layers, hq, d = queries.shape
    hkv = summaries.shape[2]
    if hq % hkv:
        raise ValueError(f"{hq} query rows do not group over {hkv} KV heads")
    scored.check("salient_scores_naive", d)
    dims = scored.count(d)
    keys = salient_decode(summaries, dims)  # [C, L, Hkv, 2, dims]
    q = queries.float()[..., scored.index(d)].reshape(layers, hkv, hq // hkv, dims)
    logits = torch.einsum("lhgd,clhkd->clhgk", q, keys) / d ** 0.5
    return torch.where(logits.isnan(), float("inf"), logits).flatten(2).amax(dim=-1)
