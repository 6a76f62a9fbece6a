"""KVFlash's device memory once vLLM has sized the KV cache (pure): what a worker's runtime takes on the device while
requests run, bounded from the settings and the pooled layers' shapes.

vLLM 0.34 sizes its extensible KV cache after warm-up from the memory then free and caps torch's allocator to what
stays free, so what a plugin allocates later must be held for it before the sizing (``patches/device_reserve.py``).
The parts, per worker:

* summaries: one per whole chunk of every request's context, in the policy's form (``summary_bytes``), for at most
  the chunks that fit the KV cache's capacity (pool and cold chunks live in its blocks) plus those the host budget
  admits, and never more than every running request at the longest context;
* queries: each request holds its last ``query_window`` tokens' queries, and as many more as a verify step may
  reject (fp32); the pooled layers' latest-token buffers hold one row per request (4 bytes an element at most);
* the step's copies: its stacked queries, a reselection's stacked summaries, and a pool of chunks staged on the
  device by page-ins and page-outs;
* the attention lengths under CUDA graphs, and with SFI the block table a fast step reads.
"""

from __future__ import annotations

from dataclasses import dataclass

PAGE_TOKENS = 16  # the bounds policy's page (policies.Bounds.page_tokens)
FP32, INT32, INT64 = 4, 4, 8


def summary_bytes(policy: str, layers: int, kv_heads: int, head: int, chunk_tokens: int, scored: int) -> int:
    """Bytes of one chunk's summary on this rank: qk's fp32 mean key, bounds' fp8 minimum and maximum per 16-token page,
    salient's two int4 keys of ``scored`` dims with an fp16 scale each; 0 for the policies that keep none."""
    if policy == "qk":
        return layers * kv_heads * head * FP32
    if policy == "bounds":
        return layers * (chunk_tokens // PAGE_TOKENS) * kv_heads * 2 * head
    if policy == "salient":
        return layers * kv_heads * 2 * (-(-scored // 2) + 2)
    return 0


@dataclass(frozen=True)
class DeviceNeeds:
    """What KVFlash's worker allocates on the device after the KV cache is sized depends on."""

    policy: str
    selection: str  # "page" or "sfi"
    layers: int  # pooled layers
    kv_heads: int  # on this rank
    q_heads: int  # on this rank
    head: int
    scored: int  # head dims a salient summary keeps
    chunk_tokens: int
    pool_chunks: int
    chunk_bytes: int  # one chunk of every pooled layer's K and V on this rank
    block_size: int
    max_num_reqs: int
    max_model_len: int
    query_keep: int  # tokens whose queries a request holds (the window and the drafts a verify step may reject)
    capacity_blocks: int  # the KV cache's blocks (an extensible cache's capacity: at least what it gets)
    host_chunks: int  # chunks the host budget admits for this engine (0 with SFI)


def device_bytes(n: DeviceNeeds) -> int:
    """The most KVFlash's runtime holds on the device after the KV cache is sized (module docstring)."""
    per_request_chunks = -(-n.max_model_len // n.chunk_tokens)
    in_cache = n.capacity_blocks * n.block_size // n.chunk_tokens
    chunks = min(n.max_num_reqs * per_request_chunks, in_cache + n.host_chunks)
    summary = summary_bytes(n.policy, n.layers, n.kv_heads, n.head, n.chunk_tokens, n.scored)
    query_row = n.layers * n.q_heads * n.head * FP32  # one token's queries of every pooled layer
    queries = n.max_num_reqs * (n.query_keep * query_row + query_row)
    step = n.max_num_reqs * n.query_keep * query_row + per_request_chunks * summary + 2 * n.pool_chunks * n.chunk_bytes
    lengths = n.max_num_reqs * (INT32 + 2 * INT64)
    if n.selection == "sfi":
        lengths += n.max_num_reqs * -(-n.max_model_len // n.block_size) * INT32
    return chunks * summary + queries + step + lengths
