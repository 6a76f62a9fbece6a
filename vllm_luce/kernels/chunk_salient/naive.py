"""Plain PyTorch references of chunk_salient, written for clarity rather than speed. ``salient_from_keys`` and
``salient_scores_naive`` are the torch paths of ``policies.Salient``."""

from __future__ import annotations

import torch

from vllm_luce.kernels.chunk_copy.naive import gather_tokens_naive


def salient_from_keys(keys: torch.Tensor) -> torch.Tensor:
    """keys [layers, tokens, kv_heads, head] -> [layers, kv_heads, head] fp8 e5m2: per layer and KV head, the
    chunk's key farthest (squared Euclidean distance, fp32) from the chunk's mean key, rounded to nearest.
    The first such token wins a tie. A NaN distance counts as +inf; a NaN or infinite key makes the mean, hence
    every distance, NaN or infinite, and the first token is chosen."""
    k = keys.float()
    dist = (k - k.mean(dim=1, keepdim=True)).square().sum(dim=-1)  # [L, T, H]
    dist = torch.where(dist.isnan(), float("inf"), dist)
    pick = dist.argmax(dim=1)  # [L, H]: torch gives the first maximum
    chosen = torch.gather(keys, 1, pick[:, None, :, None].expand(-1, 1, -1, keys.shape[-1]))[:, 0]
    return chosen.float().to(torch.float8_e5m2)


def salient_keys_naive(caches: list[torch.Tensor], slots: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[layers, kv_heads, head_dim] fp8 e5m2: ``salient_from_keys`` of the keys at cache ``slots`` (the first
    ``head_dim`` elements of each head's row in a ``[blocks, kv_heads, block_size, width]`` cache)."""
    return salient_from_keys(gather_tokens_naive(caches, slots)[..., :head_dim])


def salient_scores_naive(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """queries [L, Hq, D], keys [C, L, Hkv, D] (fp8 e5m2) -> [C, L] fp32: per layer, the max over each KV head's
    group of query rows of ``q . k / sqrt(D)`` with the chunk's salient key; a NaN logit counts as +inf."""
    layers, hq, d = queries.shape
    hkv = keys.shape[2]
    if hq % hkv:
        raise ValueError(f"{hq} query rows do not group over {hkv} KV heads")
    q = queries.float().reshape(layers, hkv, hq // hkv, d)
    logits = torch.einsum("lhgd,clhd->clhg", q, keys.float()) / d ** 0.5
    return torch.where(logits.isnan(), float("inf"), logits).flatten(2).amax(dim=-1)
