"""GPU: KVFlash pooled attention vs PyTorch SDPA over the full context, one run.

    python3 benchmarks/kvflash_pooled_attention.py --json kvflash_pooled_attention.json

Layer: Qwen3-8B shaped (32 query heads, 8 KV heads, head dim 128), bf16. Every time is a CUDA-graph
replay (as vLLM runs decode), so launch overhead does not count; ``pooled_eager_ms`` is the same
kernel launched from Python. Decode, one token per request, for each context L and batch B:
* ``sdpa_full``: ``scaled_dot_product_attention`` (flash) of the token over all L keys, contiguous;
* ``pooled``: ``pooled_attention`` over a 4K-token pool (64 chunks of 64) in shuffled slots;
* ``pooled_full``: the same kernel with the pool covering the whole context (the 1.25x goal at 32K).
Bandwidth is the bytes the kernel must read (K and V of the visible slots) over its time, compared
with the device's measured copy bandwidth. ``--sweep`` also times each page-table split count and
key-tile size.
Chunked prefill: ``pooled_attention_varlen`` for the last ``--prefill-chunk`` tokens of a context
held whole in the pool, against causal flash SDPA of the same queries over the contiguous context.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # runnable as a script path
from benchmarks import report  # noqa: E402
from benchmarks.gpu_timing import copy_bandwidth, device_info, timed, timed_graph  # noqa: E402
from vllm_luce.kernels.pooled_attention import pooled_attention, pooled_attention_varlen  # noqa: E402
from vllm_luce.kernels.pooled_attention.pooled_attention import default_splits  # noqa: E402

HQ, HKV, D, CHUNK = 32, 8, 128, 64


def pooled_case(B: int, tokens: int, context: int, g: torch.Generator):
    """B requests each owning tokens/CHUNK shuffled slots of one pool; chunks hold the last
    ``tokens`` positions of a ``context``-long sequence (sinks and selection do not change the cost)."""
    per = tokens // CHUNK
    k = torch.randn(B * per, CHUNK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    slots = torch.randperm(B * per, device="cuda", generator=g).view(B, per).to(torch.int32)
    pos = (context - tokens + torch.arange(per, device="cuda") * CHUNK).repeat(B, 1).to(torch.int32)
    lens = torch.full((B,), context, device="cuda", dtype=torch.int32)
    return k, v, slots, pos, lens


def decode_rows(args, bw: float, g: torch.Generator) -> list[dict]:
    rows = []
    for L in args.contexts:
        for B in args.batches:
            q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
            kf = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
            vf = torch.randn_like(kf)
            sdpa = timed_graph(lambda: F.scaled_dot_product_attention(q[:, :, None], kf, vf, enable_gqa=True),
                               args.reps)
            del kf, vf
            out = torch.empty(B, HQ, D, device="cuda", dtype=torch.float32)
            row = {"context": L, "batch": B, "sdpa_full_ms": round(sdpa, 4)}
            cases = [("pooled", args.pool)] + ([("pooled_full", L)] if L <= args.full_max else [])
            for name, tokens in cases:
                k, v, slots, pos, lens = pooled_case(B, tokens, L, g)
                call = lambda s=None, n=None: pooled_attention(q, k, v, slots, pos, lens, D ** -0.5,  # noqa: E731
                                                               out=out, num_splits=s, block_n=n)
                ms = timed_graph(call, args.reps)
                nbytes = 2 * B * tokens * HKV * D * 2
                row.update({f"{name}_ms": round(ms, 4), f"{name}_vs_sdpa": round(ms / sdpa, 3),
                            f"{name}_GBps": round(nbytes / (ms / 1e3) / 1e9),
                            f"{name}_bw_fraction": round(nbytes / (ms / 1e3) / bw, 3),
                            f"{name}_splits": default_splits(B * HKV, tokens // CHUNK, q.device)})
                if name == "pooled":
                    row["pooled_eager_ms"] = round(timed(call, args.reps), 4)
                if args.sweep:
                    row[f"{name}_sweep_ms"] = {s: round(timed_graph(lambda s=s: call(s), args.reps), 4)
                                               for s in (1, 2, 4, 8, 16, 32, 64, 128) if s <= tokens // CHUNK}
                    row[f"{name}_block_n_ms"] = {n: round(timed_graph(lambda n=n: call(None, n), args.reps), 4)
                                                 for n in (32, 64, 128)}
                del k, v
            rows.append(row)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()
    return rows


def prefill_rows(args, g: torch.Generator) -> list[dict]:
    rows = []
    T = args.prefill_chunk
    for L in args.prefill_contexts:
        q = torch.randn(T, HQ, D, device="cuda", dtype=torch.bfloat16, generator=g)
        kf = torch.randn(1, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
        vf = torch.randn_like(kf)
        qs = q.permute(1, 0, 2)[None]
        # causal with the queries at the end of the context: a [T, L] bottom-right mask
        mask = torch.arange(L, device="cuda")[None, :] <= torch.arange(L - T, L, device="cuda")[:, None]
        sdpa_mask = timed_graph(lambda: F.scaled_dot_product_attention(qs, kf, vf, attn_mask=mask, enable_gqa=True),
                                args.reps)
        # the flash floor: the same work without a mask tensor (every query sees all L keys)
        sdpa_flash = timed_graph(lambda: F.scaled_dot_product_attention(qs, kf, vf, enable_gqa=True), args.reps)
        del kf, vf
        k, v, slots, pos, _ = pooled_case(1, L, L, g)
        starts = torch.tensor([0, T], device="cuda", dtype=torch.int32)
        q_pos = torch.arange(L - T, L, device="cuda", dtype=torch.int32)
        out = torch.empty(T, HQ, D, device="cuda", dtype=torch.float32)
        pooled = timed_graph(lambda: pooled_attention_varlen(q, k, v, starts, q_pos, slots, pos, D ** -0.5, out=out,
                                                             max_query_len=T), args.reps)
        row = {"prefill_context": L, "query_tokens": T, "sdpa_masked_ms": round(sdpa_mask, 4),
               "sdpa_flash_unmasked_ms": round(sdpa_flash, 4), "pooled_ms": round(pooled, 4),
               "pooled_vs_flash": round(pooled / sdpa_flash, 3), "pooled_vs_masked": round(pooled / sdpa_mask, 3),
               "pooled_TFLOPs": round(4 * T * L * HQ * D / (pooled / 1e3) / 1e12, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del k, v
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768, 131072, 262144])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--pool", type=int, default=4096)
    ap.add_argument("--full-max", type=int, default=32768, help="largest context also run with the pool = context")
    ap.add_argument("--prefill-contexts", type=int, nargs="*", default=[8192, 32768])
    ap.add_argument("--prefill-chunk", type=int, default=2048)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    bw = copy_bandwidth()
    result = {**device_info(), "copy_bandwidth_GBps": round(bw / 1e9), "pool_tokens": args.pool,
              "rows": decode_rows(args, bw, g), "prefill": prefill_rows(args, g)}
    return report(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
