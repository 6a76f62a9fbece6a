"""worker.scored_dims on vLLM's own rotary embeddings: the dims a salient summary keeps for each kind of RoPE the
KVFlash executors meet (Qwen3.5/3.6 and Laguna rotate a prefix, Gemma 4's proportional RoPE the first pairs of each
neox half, a fully rotated head all of it)."""

from __future__ import annotations

import pytest
import torch

from tests.kvflash.test_query_window import _model
from vllm_luce.kernels.scored_dims import FAST_PAIRS, ScoredDims
from vllm_luce.kvflash.worker import scored_dims


def _rope(head: int, parameters: dict, neox: bool = True):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    with set_current_vllm_config(VllmConfig()):
        return get_rope(head, 4096, neox, parameters, torch.bfloat16)


@pytest.mark.parametrize("head,parameters,neox,expected", [
    (128, {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}, True, ScoredDims(32)),  # Qwen3.6
    (64, {"rope_type": "default", "rope_theta": 5e5, "partial_rotary_factor": 0.5}, True, ScoredDims(32)),  # Laguna
    (512, {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}, True,
     ScoredDims(64, 256)),  # Gemma 4's global layers: pairs 0-63 of each half rotate
    (128, {"rope_type": "default", "rope_theta": 1e6}, True, ScoredDims(FAST_PAIRS, 64)),  # Qwen3 dense
    (128, {"rope_type": "default", "rope_theta": 1e6}, False, ScoredDims(2 * FAST_PAIRS)),  # interleaved pairs
], ids=["qwen3_6", "laguna", "gemma4", "whole-neox", "whole-interleaved"])
def test_scored_dims_of_vllms_rotary_embeddings(head, parameters, neox, expected):
    rotary = _rope(head, parameters, neox)
    got = scored_dims(*_model(rotary))
    assert got == expected
    got.check("test", head)
    kept = got.index(head)
    sin = rotary.cos_sin_cache[1, rotary.rotary_dim // 2:].float()  # position 1: a rotating pair's sine is not 0
    rotating = torch.zeros(head, dtype=torch.bool)
    pairs = torch.nonzero(sin).flatten()
    if neox:
        half = rotary.rotary_dim // 2
        rotating[pairs] = rotating[pairs + half] = True
    else:
        rotating[2 * pairs] = rotating[2 * pairs + 1] = True
    if got.count(head) < head - 4:  # part of the head rotates: no kept dim does
        assert not rotating[kept].any()
    else:  # the whole head rotates: all but the fastest pairs are kept, a summary of D bytes
        assert got.count(head) == head - 2 * FAST_PAIRS and 2 * (got.count(head) // 2 + 2) == head
