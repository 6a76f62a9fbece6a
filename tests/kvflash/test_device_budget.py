"""What KVFlash takes on the device after vLLM 0.34 sizes its KV cache (``kvflash/device_budget.py``): the summary
sizes are those the policies make, the bound follows the capacity, the host budget and the longest context, and a
request holds its own queries, not a view of the step's batch."""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_luce.kernels.scored_dims import ScoredDims
from vllm_luce.kvflash.device_budget import DeviceNeeds, device_bytes, summary_bytes
from vllm_luce.kvflash.kv_store import PACKED_LAYOUT
from vllm_luce.kvflash.pager import PagerConfig
from vllm_luce.kvflash.policies import make_policy
from vllm_luce.kvflash.pool_store import summarize
from vllm_luce.kvflash.query_window import push_queries
from vllm_luce.kvflash.runtime import KVFlashRuntime

LAYERS, KV_HEADS, HEAD, BLOCK, CHUNK = 3, 2, 64, 32, 32


def runtime(policy: str, **kw) -> KVFlashRuntime:
    caches = [torch.randn(8, KV_HEADS, BLOCK, 2 * HEAD) for _ in range(LAYERS)]
    return KVFlashRuntime(PagerConfig(pool_tokens=192, chunk_tokens=CHUNK), policy, caches, PACKED_LAYOUT, HEAD,
                          BLOCK, 4, scored_dims=ScoredDims(16), max_model_len=1000, **kw)


@pytest.mark.parametrize("policy", ["qk", "bounds", "salient", "lru"])
def test_a_chunk_summary_takes_the_bytes_the_budget_counts(policy):
    rt = runtime(policy)
    store = rt._new_store()
    store.row = np.array([1, 2], dtype=np.int64)
    made = summarize(rt.policy, store, 0) if getattr(rt.policy, "needs_summaries", False) else torch.zeros(0)
    scored = getattr(rt.policy, "scored", ScoredDims()).count(HEAD)
    assert made.numel() * made.element_size() == summary_bytes(policy, LAYERS, KV_HEADS, HEAD, CHUNK, scored)


NEEDS = DeviceNeeds(policy="salient", selection="page", layers=16, kv_heads=4, q_heads=24, head=256, scored=192,
                    chunk_tokens=64, pool_chunks=64, chunk_bytes=16 * 64 * 4 * 512 * 2, block_size=64,
                    max_num_reqs=64, max_model_len=65536, query_keep=8, capacity_blocks=10_000,
                    host_chunks=20_000)


def test_the_summaries_are_bounded_by_the_cache_and_the_host_or_by_every_request_at_the_longest_context():
    per_chunk = summary_bytes("salient", 16, 4, 256, 64, 192)
    fixed = device_bytes(replace(NEEDS, capacity_blocks=0, host_chunks=0))
    assert per_chunk == 16 * 4 * 2 * (96 + 2)
    assert device_bytes(NEEDS) - fixed == (10_000 + 20_000) * per_chunk  # cache capacity, then host memory
    few = replace(NEEDS, max_num_reqs=1)
    assert device_bytes(few) - device_bytes(replace(few, capacity_blocks=0, host_chunks=0)) == 1024 * per_chunk
    assert device_bytes(replace(NEEDS, policy="lru")) < device_bytes(NEEDS)
    query_row = 16 * 24 * 256 * 4
    assert fixed >= 64 * (8 + 1) * query_row + 2 * 64 * NEEDS.chunk_bytes  # held queries, buffers, staged chunks
    assert device_bytes(replace(NEEDS, selection="sfi")) > device_bytes(NEEDS)  # the fast steps' block table


def test_the_runtime_budget_reads_its_shapes_and_the_hosts_budget():
    rt = runtime("salient", ledger=SimpleNamespace(budget=10 * 2**20), ranks=2)
    chunk_bytes = LAYERS * CHUNK * KV_HEADS * 2 * HEAD * 4
    expected = DeviceNeeds(policy="salient", selection="page", layers=LAYERS, kv_heads=KV_HEADS, q_heads=6, head=HEAD,
                           scored=48, chunk_tokens=CHUNK, pool_chunks=6, chunk_bytes=chunk_bytes, block_size=BLOCK,
                           max_num_reqs=4, max_model_len=1000, query_keep=1, capacity_blocks=100,
                           host_chunks=10 * 2**20 // (chunk_bytes * 2))
    assert rt.device_bytes_after_sizing(100, 6) == device_bytes(expected)
    assert runtime("lru").device_bytes_after_sizing(100, None) == device_bytes(
        replace(expected, policy="none", q_heads=KV_HEADS, host_chunks=0))


def test_a_request_holds_its_own_queries_not_the_steps_batch():
    batch = torch.randn(16, 2, 4, 8)  # a step's stacked queries of 16 requests
    pager = SimpleNamespace(num_tokens=5)
    push_queries(pager, batch[3:4], window=1)
    held = pager.query_tokens
    assert torch.equal(held, batch[3:4])
    assert held.untyped_storage().nbytes() == held.numel() * held.element_size()


def test_the_salient_policy_counts_the_dims_it_scores():
    policy = make_policy("salient", scored=ScoredDims(16))
    assert summary_bytes("salient", 1, 1, HEAD, CHUNK, policy.scored.count(HEAD)) == 2 * (24 + 2)
