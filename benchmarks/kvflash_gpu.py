"""KVFlash through vLLM on one GPU (Qwen3-8B shape, dummy weights): decode cost, KV bytes and admission vs off.

In one run: decode cost against context with KVFlash on and off, GPU KV bytes per request, and how many long
requests the KV cache admits.

    python -m benchmarks.kvflash_gpu --json kvflash_gpu.json          # 3 engines, one after another (--budget 560)
    python -m benchmarks.kvflash_gpu --tiny --json /tmp/kvflash.json  # CPU smoke run: tiny shapes, about 1 minute
    python -m benchmarks.kvflash_gpu --modes vllm kvflash --contexts 1024 8192 --profile 32   # where a step's time goes

Model: Qwen3.6 as vLLM 0.26 serves it (``Qwen3_5ForConditionalGeneration``) with every layer full attention at
Qwen3-8B's shape (36 layers, hidden 4096, 32/8 heads of 128, MLP 12288, vocabulary 151,936), config-only with
``load_format="dummy"`` (``vllm_gpu_common.qwen36_full_attention``). KVFlash attaches to this family's executor,
not to vLLM's dense ``Qwen3ForCausalLM``; Qwen3.6's attention gate makes q_proj twice Qwen3-8B's (8.8B
parameters instead of 8.2B), so a step reads about 7% more weight bytes than Qwen3-8B's.

Engines (``--modes``), one after another, each in a child process with vLLM's serve defaults and the same KV
cache (``--gpu-share`` of the card, vLLM's profiling; or ``--kv-gib``):
* ``vllm``: vLLM alone (``VLLM_PLUGINS=`` empty), vLLM's own Qwen3.5 class: the baseline;
* ``off``: vllm-luce installed, KVFlash off (its executor; should match ``vllm``);
* ``kvflash``: ``{"luce": {"kvflash": {"pool_tokens": POOL}}}`` (policy qk, chunks of 64).
Prefix caching is off in all three: KVFlash turns it off, and vLLM alone cannot run this model with it (vLLM
counts Qwen3.5 as hybrid, and its prefix caching for hybrids, ``mamba_cache_mode="align"``, asserts "no mamba
layers in the model" on the first step, 0.26 and 0.32 alike). Every prompt is distinct random ids anyway.

Measured in each engine (``decode_window``):
* batch 1 at each of ``--contexts``: the prompt is prefilled, then the window opens 2 tokens after the first and
  runs ``--decode-steps`` steps. ``step_ms`` = window wall time / steps: decode alone, no prefill in it;
* ``--batch`` requests of ``--batch-context`` tokens submitted together: the window opens once every one has its
  first token (all prefilled) and closes after ``--decode-steps`` steps of each; ``tok_s`` = tokens / wall time.
  If vLLM's own maximum concurrency for that length is below ``--batch``, only that many run (``requests``);
* at the window's end, while the requests hold their KV: vLLM's ``kv_cache_usage_perc`` and
  ``num_requests_running``, KVFlash's worker totals (``luce_kvflash``: host bytes held, paging counts) and the
  ``vllm:luce_*`` metrics. GPU KV bytes per request = usage x the KV cache's bytes / running requests;
* at startup: the KV cache vLLM allocated and vLLM's maximum concurrency (``get_max_concurrency_for_kv_cache_config``,
  the number it logs) for requests of each length: how many of them the cache admits at once;
* KVFlash reselects every max(16, context / 45) decoded tokens, so a 128-step window at 32K and beyond holds no
  reselection: ``amortized_step_ms`` adds the measured cost of one (``amortize``) once per that many steps.

The issue's reference figures for vLLM alone (Qwen3-8B: decode steps at 1K and 128K, batch 1; a step of 8 requests
of 64K; the KV cache's tokens at utilization 0.85) go into the JSON as ``reference_vllm_h200``. Goals: with KVFlash,
the longest context's step within 1.15x of 8K's; 1.7x vLLM's decode rate at the longest context, batch 1; 3x
vLLM's decode tokens/s for the batch. The summary prints each against vLLM alone and against ``off``.

Where cold KV goes: first to KV cache blocks vLLM has free (``cold_outs``, a copy inside the GPU), then to host
memory within the host's budget (``host_bytes`` auto: half the memory available when the first server starts;
``--host-gib``); a request whose page-outs would not fit waits. ``dropped`` counts chunks dropped (only with
``host_full: drop``): the summary's goal is 0. 8 x 64K tokens page out about 70 GB at this shape. The batch's
last first token (``last_ttft_s``) is compared with vLLM alone's (goal: within 1.25x).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from benchmarks import report, vllm_gpu_common as G
from vllm_luce.kvflash.decisions import Decisions
from vllm_luce.kvflash.pager import PagerConfig

MODES = ("kvflash", "vllm", "off")  # in this order: if the budget runs out, the optional engine is the one left out
GOAL_FLAT, GOAL_LONG, GOAL_BATCH, GOAL_LAST_TTFT = 1.15, 1.7, 3.0, 1.25


def shape_of(tiny: bool) -> dict:
    return G.TINY_TARGET if tiny else G.QWEN3_8B


async def decode_window(engine, prompts: list[list[int]], steps: int, tag: str, max_len: int, skip: int = 2,
                        sample=None, profile=None) -> dict:
    """Decode time with every request of ``prompts`` decoding and none prefilling.

    All requests are submitted together; once each has its first token (all prompts prefilled), the window
    opens ``skip`` tokens later and closes after ``steps`` more decode steps of every request; then they are
    cancelled (vLLM aborts them). ``sample()`` (worker and metric readings) runs at the window's end, while
    they still hold their KV. ``step_ms``: window wall time / steps; ``tok_s``: tokens produced in it / wall.
    ``profile``: ``(name, steps, start, stop)`` windows after the measured one, each ``steps`` more decode steps of the
    same requests between ``await start()`` and ``await stop()``, whose result is the row's ``name`` (profilers
    slow steps, so they stay out of the measured window)."""
    records = [{} for _ in prompts]
    # As long as the context allows: a request prefilled first decodes while the others prefill, and must not
    # finish before the window closes (the requests are cancelled first).
    limit = max_len - max(len(p) for p in prompts)
    tasks = [asyncio.create_task(G.stream(engine, ids, limit, f"{tag}-{i}", r))
             for i, (ids, r) in enumerate(zip(prompts, records))]
    while not all(len(r.get("times", ())) for r in records):
        await asyncio.sleep(0.002)
        _raise_failed(tasks)
    opened = [len(r["times"]) - 1 + skip for r in records]
    while not all(len(r["times"]) > o + steps for r, o in zip(records, opened)):
        await asyncio.sleep(0.002)
        _raise_failed(tasks)
    sampled = await sample() if sample else {}
    for name, more, start, stop in profile or ():
        await start()
        marks = [len(r["times"]) for r in records]
        while not all(len(r["times"]) > m + more for r, m in zip(records, marks)):
            await asyncio.sleep(0.002)
            _raise_failed(tasks)
        wall = min(r["times"][m + more] for r, m in zip(records, marks)) - max(r["times"][m] for r, m in zip(records, marks))
        sampled[name] = {"steps": more, "step_ms_profiled": round(wall / more * 1e3, 3), **await stop()}
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    t_open = max(r["times"][o] for r, o in zip(records, opened))
    t_close = min(r["times"][o + steps] for r, o in zip(records, opened))
    tokens = sum(sum(t_open < t <= t_close for t in r["times"]) for r in records)
    wall = t_close - t_open
    return {"requests": len(prompts), "prompt_tokens": [len(p) for p in prompts],
            "ttft_s": [round(r["times"][0] - r["submit"], 3) for r in records],
            "window_s": round(wall, 4), "window_tokens": tokens,
            "step_ms": round(wall / (tokens / len(prompts)) * 1e3, 3) if tokens else None,
            "tok_s": round(tokens / wall, 1) if wall > 0 else None, **sampled}


def _raise_failed(tasks) -> None:
    """A request that failed, or finished before the window closed (it would never close), stops the run."""
    for t in tasks:
        if t.done():
            raise t.exception() or RuntimeError("a request finished before the decode window closed")


def kv_cache_report(worker, lengths: list[int]) -> dict:
    """The KV cache vLLM allocated (``kv_cache_config``) and vLLM's own maximum concurrency for a request of each
    length in ``lengths`` (``get_max_concurrency_for_kv_cache_config``, the number vLLM logs at startup for
    max_model_len), read with max_model_len set to that length. KVFlash's spec caps a request at its pool."""
    import copy

    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    runner = worker.model_runner
    kv = runner.kv_cache_config
    groups = [{"type": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names),
               "block_size": g.kv_cache_spec.block_size, "page_bytes": g.kv_cache_spec.page_size_bytes,
               "pool_tokens": getattr(g.kv_cache_spec, "pool_tokens", None)} for g in kv.kv_cache_groups]
    concurrency = {}
    for n in lengths:
        config = copy.copy(runner.vllm_config)
        config.model_config = copy.copy(config.model_config)
        config.model_config.max_model_len = n
        concurrency[str(n)] = round(get_max_concurrency_for_kv_cache_config(config, kv), 2)
    total = sum(t.size for t in kv.kv_cache_tensors)
    tokens = kv.num_blocks * groups[0]["block_size"] if len(groups) == 1 else None
    return {"num_blocks": kv.num_blocks, "kv_cache_bytes": total, "kv_cache_tokens": tokens, "groups": groups,
            "max_concurrency": concurrency}


def kvflash_report(worker) -> dict:
    """KVFlash's totals on this worker (as ``tests/gpu/engine.py`` reads them), also published to ``/metrics`` at
    once; ``bound`` False without it."""
    runtime = getattr(worker.model_runner, "luce_kvflash", None)
    if runtime is None:
        return {"bound": False}
    runtime.publish_metrics()
    return {"bound": True, "pool_tokens": runtime.config.pool_tokens, "live_requests": len(runtime.pagers),
            "host_bytes": runtime.host_bytes(), "host_budget": runtime.host_budget,
            "host_pinned_bytes": runtime.pinned_bytes(), "pageable_page_outs": runtime.pageable_page_outs(),
            "resident_tokens": [p.resident_tokens() for p in runtime.pagers.values()], **runtime.stats()}


def profiler_start(worker) -> bool:
    """``--profile``: torch's profiler on this worker until ``profiler_stop``."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    worker.bench_profiler = torch.profiler.profile(activities=activities)
    worker.bench_profiler.__enter__()
    return True


def python_profiler_start(worker) -> bool:
    """``--profile``: cProfile on the thread that runs this call: the engine core's, which schedules and runs the
    model's steps (one GPU, in-process worker)."""
    import cProfile

    worker.bench_python_profiler = cProfile.Profile()
    worker.bench_python_profiler.enable()
    return True


def python_profiler_stop(worker, top: int) -> dict:
    """The ``top`` Python functions by own time and by cumulative time (ms, calls) since ``python_profiler_start``."""
    import pstats

    profiler = worker.bench_python_profiler
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # (file, line, name) -> (calls, primitive calls, own s, cumulative s, callers)

    def ranked(index):
        rows = sorted(stats.items(), key=lambda kv: kv[1][index], reverse=True)[:top]
        return [[f"{f.rsplit('site-packages/', 1)[-1]}:{line}({name})", round(v[index] * 1e3, 3), v[0]]
                for (f, line, name), v in rows]

    return {"own_ms": ranked(2), "cumulative_ms": ranked(3)}


def profiler_stop(worker, top: int) -> dict:
    """The ``top`` operations by self device time and by self host time (ms, calls) since ``profiler_start``."""
    profiler = worker.bench_profiler
    profiler.__exit__(None, None, None)
    events = profiler.key_averages()

    def ranked(key):
        return [[e.key, round(getattr(e, key) / 1e3, 3), e.count]
                for e in sorted(events, key=lambda e: getattr(e, key), reverse=True)[:top]]

    return {"device_ms": ranked("self_device_time_total"), "host_ms": ranked("self_cpu_time_total")}


def amortize(row: dict, steps: int) -> None:
    """KVFlash reselects every ``tau`` decoded tokens, the largest power of two up to max(16, context / 45)
    (``Decisions.interval``): every 2,048 at 128K, so a window of 128 steps at long contexts holds none.
    ``amortized_step_ms`` adds each request's reselection cost once per tau steps, the cost measured over the request
    (its prompt-end reselection included)."""
    before, after = row.get("kvflash_before", {}), row.get("kvflash", {})
    count = after.get("reselections", 0) - before.get("reselections", 0)
    if not after.get("bound") or not count or not row.get("step_ms"):
        return
    seconds = after["reselect_s"] - before["reselect_s"]
    tau = Decisions(chunk_tokens=64, pool_tokens=0, epoch_tokens=64, tau_min=PagerConfig.tau_min,
                    prompt_tokens=0).interval(max(row["prompt_tokens"]) + steps)
    row.update(reselections=count, reselection_ms=round(seconds / count * 1e3, 3), tau_tokens=tau,
               amortized_step_ms=round(row["step_ms"] + row["requests"] * seconds / count * 1e3 / tau, 3))


async def measure(engine, spec: dict, note) -> dict:
    """In the child: startup KV facts, a warm-up, batch 1 at each context, then the batch."""
    m = spec["measure"]
    max_len, steps = spec["engine"]["max_model_len"], m["decode_steps"]
    batch_len = m["batch_context"] + m["slack_tokens"]
    kv = (await engine.collective_rpc(kv_cache_report, args=([*m["contexts"], batch_len],)))[0]
    note(kv_cache=kv)

    async def kvflash():
        return (await engine.collective_rpc(kvflash_report))[0]

    async def sample():  # the workers publish their totals first: the luce metrics read the same values
        report = await kvflash()
        return {"metrics": G.metrics(), "kvflash": report}

    await decode_window(engine, [G.random_prompt(256, 7)], 4, "warm-up", max_len)
    contexts = []
    for n in m["contexts"]:
        before = await kvflash()
        row = await decode_window(engine, [G.random_prompt(n, n)], steps, f"ctx{n}", max_len, sample=sample)
        contexts.append({"context": n, **row, "kvflash_before": before})
        note(contexts=contexts)
        print(f"[{spec['mode']}] context {n}: {row['step_ms']} ms a step", flush=True)
    profile = None
    if m.get("profile"):  # a separate window (the profilers slow steps): the prompt's prefill, then decode steps
        n = m["contexts"][min(1, len(m["contexts"]) - 1)]
        await engine.collective_rpc(profiler_start)
        await engine.collective_rpc(python_profiler_start)
        row = await decode_window(engine, [G.random_prompt(n, n + 1)], m["profile"], f"profile{n}", max_len)
        # cProfile stops first: the torch profiler's own teardown takes seconds and would fill its top 60
        python = (await engine.collective_rpc(python_profiler_stop, args=(60,)))[0]
        profile = {"context": n, "steps": m["profile"], "step_ms_profiled": row["step_ms"], "ttft_s": row["ttft_s"],
                   **(await engine.collective_rpc(profiler_stop, args=(30,)))[0], "python": python}
        note(profile=profile)
        print(f"[{spec['mode']}] profiled {m['profile']} steps at {n}", flush=True)

    async def start():
        await engine.collective_rpc(profiler_start)

    async def stop():
        return (await engine.collective_rpc(profiler_stop, args=(30,)))[0]

    async def python_start():
        await engine.collective_rpc(python_profiler_start)

    async def python_stop():
        return (await engine.collective_rpc(python_profiler_stop, args=(60,)))[0]
    admitted = int(min(m["batch"], kv["max_concurrency"][str(batch_len)]))
    batch = {"requests": 0, "skipped": "the KV cache admits no request of this length"}
    if admitted:
        before = await kvflash()
        prompts = [G.random_prompt(m["batch_context"], 1000 + i) for i in range(admitted)]
        batch = {**await decode_window(engine, prompts, steps, "batch", max_len, sample=sample,
                                       profile=[("profile", m["profile"], start, stop),
                                                ("python_profile", m["profile"], python_start, python_stop)]
                                       if m.get("profile") else None),
                 "kvflash_before": before}
        print(f"[{spec['mode']}] {admitted} x {m['batch_context']}: {batch['tok_s']} tokens/s", flush=True)
    for row in (*contexts, batch):
        running = row.get("metrics", {}).get("vllm:num_requests_running")
        usage = row.get("metrics", {}).get("vllm:kv_cache_usage_perc")
        if running and usage is not None:
            row["gpu_kv_bytes_per_request"] = int(usage * kv["kv_cache_bytes"] / running)
        amortize(row, steps)
    return {"kv_cache": kv, "batch_length": batch_len, "contexts": contexts, "batch": batch,
            **({"profile": profile} if profile else {})}


def summarize(results: dict, contexts: list[int]) -> dict:
    """Ratios of each engine against vLLM alone and against the plugin with KVFlash off, and the goals."""
    def step(mode, n):
        row = next((r for r in results.get(mode, {}).get("contexts", []) if r["context"] == n), {})
        return row.get("step_ms")

    def batch_rate(mode):
        return results.get(mode, {}).get("batch", {}).get("tok_s")

    longest = max(contexts)
    flat_base = 8192 if 8192 in contexts else min(contexts)
    out = {"longest_context": longest, "flat_base_context": flat_base}
    for mode, r in results.items():
        b, kv = r.get("batch", {}), r["kv_cache"]
        kv_bytes = {c["context"]: c.get("gpu_kv_bytes_per_request") for c in r["contexts"]}
        out[mode] = {"step_ms": {n: step(mode, n) for n in contexts},
                     "amortized_step_ms": {c["context"]: c.get("amortized_step_ms") for c in r["contexts"]},
                     "ratio_to_flat_base": {n: G.ratio(step(mode, n), step(mode, flat_base), 3) for n in contexts},
                     "batch_tok_s": batch_rate(mode), "batch_step_ms": b.get("step_ms"),
                     "batch_amortized_step_ms": b.get("amortized_step_ms"),
                     "batch_requests": b.get("requests"),
                     "gpu_kv_bytes_per_request": {**kv_bytes, "batch": b.get("gpu_kv_bytes_per_request")},
                     "kv_cache_bytes": kv["kv_cache_bytes"], "kv_cache_tokens": kv["kv_cache_tokens"],
                     "max_concurrency_batch_length": kv["max_concurrency"][str(r["batch_length"])],
                     "host_bytes_batch": b.get("kvflash", {}).get("host_bytes"),
                     "batch_last_ttft_s": max(b.get("ttft_s") or [0]) or None,
                     "cold_page_outs_batch": b.get("kvflash", {}).get("cold_outs"),
                     "host_page_outs_batch": (b.get("kvflash", {}).get("page_outs") or 0)
                     - (b.get("kvflash", {}).get("cold_outs") or 0),
                     "host_chunks_dropped": b.get("kvflash", {}).get("dropped")}
    for base in ("vllm", "off"):
        if base in results and "kvflash" in results:
            out[f"kvflash_vs_{base}"] = {
                "decode_speedup": {n: G.ratio(step(base, n), step("kvflash", n)) for n in contexts},
                "batch_tok_s_ratio": G.ratio(batch_rate("kvflash"), batch_rate(base))}
    if "kvflash" in results:
        flat = out["kvflash"]["ratio_to_flat_base"][longest]
        amortized = out["kvflash"]["amortized_step_ms"]
        goals = {"flat": {"value": flat, "goal": f"<= {GOAL_FLAT}", "met": flat is not None and flat <= GOAL_FLAT},
                 "flat_amortized": {"value": G.ratio(amortized.get(longest), amortized.get(flat_base), 3),
                                    "goal": f"<= {GOAL_FLAT} (reselections included)"}}
        for base in ("vllm", "off"):
            if f"kvflash_vs_{base}" in out:
                long, rate = out[f"kvflash_vs_{base}"]["decode_speedup"][longest], out[f"kvflash_vs_{base}"][
                    "batch_tok_s_ratio"]
                goals[f"longest_vs_{base}"] = {"value": long, "goal": f">= {GOAL_LONG}",
                                               "met": long is not None and long >= GOAL_LONG}
                goals[f"batch_vs_{base}"] = {"value": rate, "goal": f">= {GOAL_BATCH}",
                                             "met": rate is not None and rate >= GOAL_BATCH}
                last = G.ratio(out["kvflash"]["batch_last_ttft_s"], out[base]["batch_last_ttft_s"], 3)
                goals[f"batch_last_ttft_vs_{base}"] = {"value": last, "goal": f"<= {GOAL_LAST_TTFT}",
                                                       "met": last is not None and last <= GOAL_LAST_TTFT}
        dropped = out["kvflash"]["host_chunks_dropped"]
        goals["chunks_dropped"] = {"value": dropped, "goal": "0", "met": dropped == 0}
        out["goals"] = goals
    return out


def table(results: dict, contexts: list[int]) -> str:
    lines = ["| engine | " + " | ".join(f"{n:,} ms/step" for n in contexts) + " | batch tok/s | batch requests | "
             "KV bytes/request (batch) | max concurrency (batch length) | host bytes (batch) |",
             "|" + " --- |" * (len(contexts) + 6)]
    for mode, r in results.items():
        if "error" in r:
            lines.append(f"| {mode} | failed: {r['error'][:120]} |")
            continue
        steps = [next((c["step_ms"] for c in r["contexts"] if c["context"] == n), None) for n in contexts]
        b, admits = r["batch"], r["kv_cache"]["max_concurrency"][str(r["batch_length"])]
        cells = [*steps, b.get("tok_s"), b.get("requests"), b.get("gpu_kv_bytes_per_request"), admits,
                 b.get("kvflash", {}).get("host_bytes")]
        lines.append(f"| {mode} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return G.child_main(argv[1:], measure)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and sizes (the CPU smoke run)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    ap.add_argument("--contexts", type=int, nargs="+", help="batch-1 contexts (default 1K 8K 32K 128K)")
    ap.add_argument("--batch", type=int, help="concurrent requests (default 8)")
    ap.add_argument("--batch-context", type=int, help="their prompt tokens (default 65536)")
    ap.add_argument("--decode-steps", type=int, help="decode steps in each window (default 128)")
    ap.add_argument("--pool", type=int, help="KVFlash pool tokens (default 4096)")
    ap.add_argument("--gpu-share", type=float, default=0.85, help="gpu_memory_utilization (the reference's 0.85)")
    ap.add_argument("--kv-gib", type=float, help="a fixed KV cache instead (kv_cache_memory_bytes)")
    ap.add_argument("--host-gib", type=float, help="KVFlash's host budget for paged-out KV (default: auto)")
    ap.add_argument("--host-pinned-gib", type=float, help="host memory KVFlash pins at startup (default: none)")
    ap.add_argument("--timeout", type=float, default=330, help="seconds each engine's child may take")
    ap.add_argument("--budget", type=float, default=560, help="seconds for all engines (a device call has 600)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/luce-bench/kvflash"), help="engine logs and specs")
    ap.add_argument("--models", type=Path, default=Path("/tmp/luce-bench/models"), help="config-only checkpoints")
    ap.add_argument("--profile", type=int, default=0, metavar="STEPS",
                    help="also profile a prompt of the second context and STEPS decode steps after it (torch "
                         "profiler and cProfile of the engine core's thread), and after the batch's window STEPS more "
                         "(torch) and STEPS more (cProfile): top ops and Python functions in the JSON")
    ap.add_argument("--gpus", type=int, default=1, help="engines side by side, one per card (default: one after another on one card)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    tiny = args.tiny
    contexts = args.contexts or ([256, 512, 1024] if tiny else [1024, 8192, 32768, 131072])
    batch, batch_context = args.batch or (4 if tiny else 8), args.batch_context or (768 if tiny else 65536)
    steps, pool = args.decode_steps or (8 if tiny else 128), args.pool or (384 if tiny else 4096)
    slack = 256 if tiny else 2048  # room for a batch request that decodes while the others prefill
    max_len = max(*contexts, batch_context + slack) + steps + 64
    cuda = G.has_cuda()
    model = G.qwen36_full_attention(args.models / ("qwen36-full-tiny" if tiny else "qwen36-full-8b"),
                                    shape_of(tiny), max(max_len, 4096))
    kvflash = {"pool_tokens": pool, **({"host_bytes": int(args.host_gib * 2**30)} if args.host_gib else {}),
               **({"host_pinned_bytes": int(args.host_pinned_gib * 2**30)} if args.host_pinned_gib is not None else {})}
    out = {**G.header(["benchmarks.kvflash_gpu", *argv]), "model": "Qwen3_5ForConditionalGeneration, all layers "
           "full attention", "shape": shape_of(tiny), "pool_tokens": pool, "max_model_len": max_len,
           "settings": {"contexts": contexts, "batch": batch, "batch_context": batch_context, "decode_steps": steps,
                        "gpu_share": args.gpu_share, "kv_gib": args.kv_gib, "host_gib": args.host_gib,
                        "host_pinned_gib": args.host_pinned_gib},
           "reference_vllm_h200": {"step_ms_1k": 5.25, "step_ms_128k": 9.96, "batch_8x64k_step_ms": 24.1,
                                   "kv_cache_tokens_at_0.85": 740_000}, "results": {}}
    measured = {"contexts": contexts, "batch": batch, "batch_context": batch_context, "decode_steps": steps,
                "slack_tokens": slack, "profile": args.profile}
    kv_bytes = int(args.kv_gib * 2**30) if args.kv_gib else None
    specs = {mode: {"mode": mode, "measure": measured, "engine": G.engine_args(
        model, max_len, cuda, kv_bytes=kv_bytes, gpu_share=args.gpu_share, enable_prefix_caching=False,
        additional={"luce": {"kvflash": kvflash}} if mode == "kvflash" else {})} for mode in args.modes}
    ok = G.run_engines("benchmarks.kvflash_gpu", specs, out, args, cuda)
    out = {**G.facts_of(out["results"]), **out, "summary": summarize(ok, contexts)}
    report(out, args.json)
    print(table(out["results"], contexts), file=sys.stderr)
    return 0 if len(ok) == len(args.modes) else 1


if __name__ == "__main__":
    from benchmarks.kvflash_gpu import main as imported_main  # the workers resolve functions by module name

    raise SystemExit(imported_main())
