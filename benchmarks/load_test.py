"""Load test: concurrent `openai` streams against `vllm serve` with every vllm-luce feature on, and the
same workload against a server with the features off.

Workload (deterministic): held-out code of the trained test model. Every 4th request has a long prompt
(PFlash compresses it and KVFlash pages it); the rest are short (the KVFlash pool covers them and
PFlash leaves them alone). Even requests are greedy, odd ones sampled (temperature 0.8).
Reported: errors, throughput, TTFT and latency percentiles, host memory (RSS of the server's process
tree) after warm-up and at the end, and how many greedy outputs equal the features-off server's.
A greedy output that differs must differ first where the features-off server's top two tokens are
within ``TIE_NATS`` (bf16 near-ties: either token is a correct greedy choice).

    python -m benchmarks.load_test [--requests 300] [--concurrency 32] [--tp 2] [--kvflash-pflash] [--logs DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

# The harness (workload, streams, summaries, greedy comparison) is shared with the end-to-end tests.
from fixtures.serve_load import compare_greedy, luce_args, metric, serve_and_load, tp_args, workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel size of every server")
    ap.add_argument("--kvflash-pflash", action="store_true",
                    help="also a server with KVFlash and PFlash but no DFlash: what DFlash and its gate cost or "
                         "gain under this load")
    ap.add_argument("--logs", type=Path, help="keep each server's log in this directory (the gate's decisions)")
    args = ap.parse_args()
    env = {"VLLM_CPU_OMP_THREADS_BIND": "|".join(str(i) for i in range(args.tp))} if args.tp > 1 else {}
    items = workload(args.requests)
    servers = [("features off", tp_args(args.tp), True), ("features on", luce_args(args.tp), False)]
    if args.kvflash_pflash:
        no_dflash = [a for a in luce_args(args.tp) if a not in ("--speculative-model", "dflash")]
        servers.insert(1, ("KVFlash + PFlash", no_dflash, False))
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: serve_and_load(Path(tmp), name.split()[-1].lower(), extra, items, args.concurrency, logprobs,
                                     env) for name, extra, logprobs in servers}
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
        for name, run in runs.items():
            (args.logs / f"{name.replace(' ', '_').replace('+', 'and')}.log").write_text(run["log"])
    off, on = runs["features off"], runs["features on"]
    for name, run in runs.items():
        growth = run["rss"]["end"] / run["rss"]["after_warmup"] - 1
        print(f"{name}: {json.dumps(run['summary'])}; host RSS {run['rss']['after_warmup'] / 2**20:.0f} -> "
              f"{run['rss']['end'] / 2**20:.0f} MiB ({growth:+.1%})")
    if "KVFlash + PFlash" in runs:
        base = runs["KVFlash + PFlash"]["summary"]["seconds"]
        print(f"all features / KVFlash + PFlash throughput: {base / on['summary']['seconds']:.2f}x "
              "(DFlash and its gate)")
    cmp = compare_greedy(on["results"], off["results"])
    print(f"greedy outputs vs features off: {cmp['identical']} identical, {cmp['near_tie']} first differ at a "
          f"near-tie, {len(cmp['mismatches'])} mismatches of {cmp['greedy_compared']}")
    m = on["metrics"]
    print(f"DFlash drafts {metric(m, 'vllm:luce_dflash_drafts_total'):.0f}, accepted "
          f"{metric(m, 'vllm:luce_dflash_accepted_tokens_total'):.0f}; PFlash compressed "
          f"{metric(m, 'vllm:luce_pflash_prompts_total', outcome='compressed'):.0f}; KVFlash page-outs "
          f"{metric(m, 'vllm:luce_kvflash_page_outs_total'):.0f}")


if __name__ == "__main__":
    main()
