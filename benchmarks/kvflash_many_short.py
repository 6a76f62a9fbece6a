"""KVFlash beside many short requests (issue 68): short requests that never page keep vLLM alone's throughput while
a long request runs beside them, and the long one completes.

    python -m benchmarks.kvflash_many_short --json many_short.json        # vLLM alone, then KVFlash (--budget 560)
    python -m benchmarks.kvflash_many_short --tiny --json /tmp/many.json  # CPU smoke run: tiny shapes

In each engine (``benchmarks/kvflash_gpu.py``'s model, Qwen3.6 at Qwen3-8B's shape with dummy weights, every layer
full attention; vLLM's serve defaults): the long request (``--long-context`` tokens) is prefilled, then
``--shorts`` short requests (``--short-context`` tokens, ``--short-tokens`` each) arrive together while it decodes.
``short_tok_s``: the short requests' tokens / the time from their arrival to the last one's end. With KVFlash the
long request holds its pool and, while the cache has room, blocks lent for its cold chunks, which come back as the
short requests need them; vLLM alone holds its whole context. Lost in the same run, per engine: requests failed,
the long request not completed, vLLM's preemptions; with KVFlash, chunks dropped or lost and host chunks beyond
their reservation. Goal: KVFlash's ``short_tok_s`` at least 0.95x vLLM alone's, with nothing lost.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from benchmarks import report, vllm_gpu_common as G
from benchmarks.kvflash_gpu import kvflash_report, shape_of
from fixtures.engine_report import registry_metrics

MODES = ("vllm", "kvflash")
GOAL_SHORT = 0.95


async def _run(engine, ids: list[int], max_tokens: int, request_id: str, record: dict) -> dict:
    """``G.stream``, with a failure recorded instead of raised (the run counts it)."""
    try:
        return await G.stream(engine, ids, max_tokens, request_id, record)
    except Exception as exc:  # noqa: BLE001 - a failed request is a result here
        record["error"] = f"{type(exc).__name__}: {exc}"[:300]
        return record


async def measure(engine, spec: dict, note) -> dict:
    """In the child: a warm-up, the long request prefilled, then the short requests beside it."""
    m = spec["measure"]
    await _run(engine, G.random_prompt(64, 7), 4, "warm-up", {})
    long, shorts = {}, [{} for _ in range(m["shorts"])]
    long_task = asyncio.create_task(_run(engine, G.random_prompt(m["long_context"], 1), m["long_tokens"], "long", long))
    while not long.get("times") and not long_task.done():  # its prefill done: it decodes as the others arrive
        await asyncio.sleep(0.01)
    arrived = time.perf_counter()
    await asyncio.gather(*(_run(engine, G.random_prompt(m["short_context"], 100 + i), m["short_tokens"], f"s{i}", r)
                           for i, r in enumerate(shorts)))
    ended = max((r["times"][-1] for r in shorts if r.get("times")), default=arrived)
    await long_task
    tokens = sum(len(r.get("times", ())) for r in shorts)
    row = {"short_tokens": tokens, "short_s": round(ended - arrived, 3),
           "short_tok_s": round(tokens / (ended - arrived), 1) if ended > arrived else None,
           "short_ttft_s": sorted(round(r["times"][0] - r["submit"], 3) for r in shorts if r.get("times")),
           "failed": sum("error" in r for r in (*shorts, long)),
           "errors": sorted({r["error"] for r in (*shorts, long) if "error" in r})[:5],
           "long_completed": len(long.get("times", ())) == m["long_tokens"],
           "long_ttft_s": round(long["times"][0] - long["submit"], 3) if long.get("times") else None,
           "long_s": round(long["times"][-1] - long["submit"], 3) if long.get("times") else None,
           "kvflash": (await engine.collective_rpc(kvflash_report))[0],  # first: it publishes the workers' totals
           "metrics": registry_metrics(("vllm:num_requests_running", "vllm:num_preemptions"))}
    note(**row)
    print(f"[{spec['mode']}] {m['shorts']} short requests: {row['short_tok_s']} tokens/s, failed {row['failed']}, "
          f"long completed {row['long_completed']}", flush=True)
    return row


def lost(row: dict) -> dict:
    """What a run lost: requests failed, the long one unfinished, preemptions, chunks dropped, lost or unreserved."""
    kv = row.get("kvflash", {})
    return {"failed": row.get("failed"), "long_completed": row.get("long_completed"),
            "preemptions": row.get("metrics", {}).get("vllm:num_preemptions"),
            **{k: kv.get(k) for k in ("dropped", "lost", "host_over_reserved")}}


def summarize(results: dict) -> dict:
    alone, kv = results.get("vllm", {}), results.get("kvflash", {})
    ratio = G.ratio(kv.get("short_tok_s"), alone.get("short_tok_s"), 3)
    clean = all(r.get("failed") == 0 and r.get("long_completed") for r in (alone, kv)) and \
        not any(kv.get("kvflash", {}).get(k) for k in ("dropped", "lost", "host_over_reserved"))
    return {"short_tok_s_ratio": ratio, "goal": f">= {GOAL_SHORT}",
            "met": bool(ratio is not None and ratio >= GOAL_SHORT and clean),
            "lost": {mode: lost(r) for mode, r in results.items()},
            "blocks_given_back": kv.get("metrics", {}).get("vllm:luce_kvflash_lent_blocks_returned"),
            "cold_demotions": kv.get("kvflash", {}).get("demotions")}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return G.child_main(argv[1:], measure)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and sizes (the CPU smoke run)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--shorts", type=int, help="short requests (default 256)")
    ap.add_argument("--short-context", type=int, help="their prompt tokens (default 1024)")
    ap.add_argument("--short-tokens", type=int, help="their output tokens (default 256)")
    ap.add_argument("--long-context", type=int, help="the long request's prompt tokens (default 65536)")
    ap.add_argument("--long-tokens", type=int, help="its output tokens (default 512)")
    ap.add_argument("--pool", type=int, help="KVFlash pool tokens (default 4096)")
    ap.add_argument("--gpu-share", type=float, default=0.85, help="gpu_memory_utilization")
    ap.add_argument("--kv-gib", type=float, help="a fixed KV cache instead (kv_cache_memory_bytes)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds each engine's child may take")
    ap.add_argument("--budget", type=float, default=560, help="seconds for all engines")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/luce-bench/many-short"), help="engine logs and specs")
    ap.add_argument("--models", type=Path, default=Path("/tmp/luce-bench/models"), help="config-only checkpoints")
    ap.add_argument("--gpus", type=int, default=1, help="engines side by side, one per card")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    tiny = args.tiny
    measured = {"shorts": args.shorts or (12 if tiny else 256),
                "short_context": args.short_context or (96 if tiny else 1024),
                "short_tokens": args.short_tokens or (8 if tiny else 256),
                "long_context": args.long_context or (1536 if tiny else 65536),
                "long_tokens": args.long_tokens or (48 if tiny else 512)}
    pool = args.pool or (384 if tiny else 4096)
    max_len = measured["long_context"] + measured["long_tokens"] + 64
    cuda = G.has_cuda()
    model = G.qwen36_full_attention(args.models / ("qwen36-full-tiny" if tiny else "qwen36-full-8b"),
                                    shape_of(tiny), max(max_len, 4096))
    out = {**G.header(["benchmarks.kvflash_many_short", *argv]), "model": "Qwen3_5ForConditionalGeneration, all "
           "layers full attention", "shape": shape_of(tiny), "pool_tokens": pool, "max_model_len": max_len,
           "settings": {**measured, "gpu_share": args.gpu_share, "kv_gib": args.kv_gib}, "results": {}}
    kv_bytes = int(args.kv_gib * 2**30) if args.kv_gib else None
    specs = {mode: {"mode": mode, "measure": measured, "engine": G.engine_args(
        model, max_len, cuda, kv_bytes=kv_bytes, gpu_share=args.gpu_share, enable_prefix_caching=False,
        additional={"luce": {"kvflash": {"pool_tokens": pool}}} if mode == "kvflash" else {})} for mode in args.modes}
    ok = G.run_engines("benchmarks.kvflash_many_short", specs, out, args, cuda)
    out = {**G.facts_of(out["results"]), **out, "summary": summarize(ok)}
    report(out, args.json)
    return 0 if len(ok) == len(args.modes) else 1


if __name__ == "__main__":
    from benchmarks.kvflash_many_short import main as imported_main  # the workers resolve functions by module name

    raise SystemExit(imported_main())
