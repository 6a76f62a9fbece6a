"""CPU, through real vLLM: what DFlash under the gate costs per engine step against no speculation.

    python -m benchmarks.dflash_step_cost --pairs wrong trained --concurrency 1 4 --processes 3

Each process builds four engines on one pair: two without speculation (``none``, ``none2``) and two
with gated DFlash (``gated``, ``gated2``), times every engine step (``LLMEngine.step``) and runs
``--rounds`` rounds of ``--tokens``-token passes per concurrency, every engine once a round, in balanced
orders (``round_orders``). Two ratios per process, none over gated (1.0: the gated engine costs nothing extra):

* ``plain step``: the engines' median step times, the two of a kind summed. The gate runs almost every
  step plain on these pairs, so this is a plain step's fixed cost in a speculating engine, with the
  rare slow step (an exploration, a hiccup of the host) left out.
* ``total``: all measured step time. That is the throughput ratio (both kinds generate the same tokens),
  with the gate's explorations in it.

Why not only ``dflash_throughput``: one engine carries a speed bias of its own (identical engines in one
process can differ by over a tenth across a run, ``docs/data/dflash_throughput/``). Two engines
of each kind halve its variance, step medians drop the hiccups, and ``--processes`` builds fresh sets.
Warm-up passes (where the gate calibrates) are not measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.dflash_throughput import build, pairs, prompts_for, round_orders, run_pass
from vllm_luce.spec_decode.gate_report import summary as gate_summary

ENGINES = ("none", "gated", "none2", "gated2")
BUILD_ORDER = ("none", "gated", "gated2", "none2")


def measure(pair: str, concurrency: list[int], rounds: int, tokens: int) -> list[dict]:
    root = Path(os.environ.get("LUCE_TEST_FIXTURES") or tempfile.mkdtemp(prefix="luce-bench-"))
    target, drafter, method = pairs(root)[pair]
    # Built in a mirrored order, as dflash_throughput's BUILD_ORDER (an engine built later ran slower)
    engines = {name: build(target, drafter, method, name.rstrip("2"), max(concurrency)) for name in BUILD_ORDER}
    steps = {name: [] for name in ENGINES}
    for name, llm in engines.items():
        step = llm.llm_engine.step

        def timed(step=step, times=steps[name]):
            t = time.perf_counter()
            out = step()
            times.append(time.perf_counter() - t)
            return out

        llm.llm_engine.step = timed
    rows = []
    for c in concurrency:
        prompts = prompts_for(pair, engines["none"], c)
        for llm in engines.values():
            run_pass(llm, prompts, tokens // 2)  # warm-up: the gate calibrates here
        for times in steps.values():
            times.clear()
        for order in round_orders(ENGINES, rounds):  # each engine in each place, and after each other one
            for name in order:
                run_pass(engines[name], prompts, tokens)
        median = {name: statistics.median(steps[name]) for name in ENGINES}
        total = {name: sum(steps[name]) for name in ENGINES}
        gate = engines["gated"].llm_engine.engine_core.engine_core.scheduler.luce_gate
        rows.append({"pair": pair, "concurrency": c,
                     "median_step_us": {k: round(v * 1e6, 1) for k, v in median.items()},
                     "plain_step": (median["none"] + median["none2"]) / (median["gated"] + median["gated2"]),
                     "total": (total["none"] + total["none2"]) / (total["gated"] + total["gated2"]),
                     "gate": gate_summary(gate).split(";")[0]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def summarize(rows: list[dict]) -> str:
    lines = ["| pair | concurrency | none step µs | gated step µs | plain step none/gated (mean, per process) "
             "| total none/gated (mean, per process) |", "| --- | --- | --- | --- | --- | --- |"]
    for pair, c in sorted({(r["pair"], r["concurrency"]) for r in rows}):
        cell = [r for r in rows if (r["pair"], r["concurrency"]) == (pair, c)]
        none = statistics.mean((r["median_step_us"]["none"] + r["median_step_us"]["none2"]) / 2 for r in cell)
        gated = statistics.mean((r["median_step_us"]["gated"] + r["median_step_us"]["gated2"]) / 2 for r in cell)
        plain, total = ([r[k] for r in cell] for k in ("plain_step", "total"))
        lines.append(f"| {pair} | {c} | {none:.0f} | {gated:.0f} | **{statistics.mean(plain):.3f}** "
                     f"({', '.join(f'{x:.3f}' for x in plain)}) | **{statistics.mean(total):.3f}** "
                     f"({', '.join(f'{x:.3f}' for x in total)}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", nargs="+", default=["wrong", "trained"], choices=["right", "wrong", "trained"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--rounds", type=int, default=8, help="measured passes of each engine per concurrency")
    ap.add_argument("--tokens", type=int, default=192, help="generated tokens per request and pass")
    ap.add_argument("--processes", type=int, default=1, help="fresh sets of engines per pair, one process each")
    ap.add_argument("--kv-cache-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE of every engine")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_gib)  # the rest as dflash_throughput sets them
    if args.child:  # one pair, one set of engines (vLLM's parallel groups do not survive a second set)
        rows = measure(args.pairs[0], args.concurrency, args.rounds, args.tokens)
    else:
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for pair in args.pairs:
                for process in range(args.processes):
                    out = Path(tmp) / f"{pair}-{process}.json"
                    subprocess.run([sys.executable, "-m", "benchmarks.dflash_step_cost", "--child", "--pairs", pair,
                                    "--concurrency", *map(str, args.concurrency), "--rounds", str(args.rounds),
                                    "--tokens", str(args.tokens), "--kv-cache-gib", str(args.kv_cache_gib),
                                    "--json", str(out)], check=True)
                    rows += json.loads(out.read_text())["rows"]
        print(summarize(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, **({} if args.child else {"table": summarize(rows)})},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
